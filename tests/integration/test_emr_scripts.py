"""The EMR scripts in deploy/emr run with stub commands (`aws`, `sudo`, `dnf`, `python3.N`,
`spark-submit`) on PATH in a temp dir: no EMR cluster is reachable here. What the
documentation requires of the deploy files: tests/unit/test_deploy_files.py.
"""

from __future__ import annotations

import shutil
import signal
import stat
import subprocess
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EMR = ROOT / "deploy" / "emr"

# Delta 4.0.0 is the version on emr-spark-8.0.0; its Scala 2.13 jar has no Spark-line suffix.
EMR_PACKAGES = "org.apache.spark:spark-sql-kafka-0-10_2.13:4.0.2,io.delta:delta-spark_2.13:4.0.0"


@pytest.mark.parametrize("script", ["bootstrap.sh", "submit.sh"])
def test_emr_scripts_parse_and_are_executable(script):
    path = EMR / script
    subprocess.run(["bash", "-n", str(path)], check=True)
    assert path.stat().st_mode & stat.S_IXUSR


# --- EMR scripts, run with stub commands -------------------------------------------------


def _stub(bin_dir: Path, name: str, body: str) -> None:
    path = bin_dir / name
    path.write_text("#!/usr/bin/env bash\n" + body)
    path.chmod(0o755)


TOOLS = (
    "bash", "basename", "cat", "chmod", "cp", "dirname", "grep", "gzip", "head", "mkdir",
    "mktemp", "rm", "sed", "sleep", "tar", "tee",
)  # fmt: skip


@pytest.fixture
def node(tmp_path):
    """A fake EMR node: a PATH of stubs, S3 as a folder, a log of every stub call."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    # Only these tools and the stubs are on PATH: no real python, pip, sudo or aws is reached.
    tools = tmp_path / "tools"
    tools.mkdir()
    for tool in TOOLS:
        found = shutil.which(tool)
        assert found, tool
        (tools / tool).symlink_to(found)
    s3 = tmp_path / "s3"
    (s3 / "artifacts" / "wheels").mkdir(parents=True)
    (s3 / "artifacts" / "wheels" / "retrylib-0.1.0-py3-none-any.whl").write_text("")
    (s3 / "artifacts" / "wheels" / "my_handlers-1.0-py3-none-any.whl").write_text("")
    subprocess.run(
        ["tar", "-czf", str(s3 / "artifacts" / "retrylib-src.tar.gz"), "jobs", "deploy"],
        cwd=ROOT,
        check=True,
    )
    (s3 / "conf").mkdir()
    (s3 / "conf" / "orders.toml").write_text("[job]\n")
    log = tmp_path / "calls.log"
    _stub(
        bin_dir,
        "aws",
        f"""echo "aws $*" >> {log}
[[ $1 == s3 && $2 == cp ]] || exit 9
if [[ $3 == --recursive ]]; then src=$4 dst=$5; else src=$3 dst=$4; fi
src={s3}/${{src#s3://bucket/}}
if [[ $3 == --recursive ]]; then mkdir -p "$dst" && cp -r "$src"/. "$dst"; else cp "$src" "$dst"; fi
""",
    )
    _stub(bin_dir, "sudo", f'echo "sudo $*" >> {log}\nexec "$@"\n')
    python_stub = f"""echo "$(basename "$0") $*" >> {log}
[[ $1 == -c ]] && {{ echo "${{0##*python}}"; exit 0; }}
[[ "$1 $2" == "-m pip" ]] && exit 0
exit 9
"""
    _stub(
        bin_dir,
        "dnf",
        f"""echo "dnf $*" >> {log}
for package in "${{@:3}}"; do
  [[ $package == *-pip ]] && continue
  cat > {bin_dir}/$package <<'PY'
#!/usr/bin/env bash
{python_stub}PY
  chmod +x {bin_dir}/$package
done
""",
    )
    info = tmp_path / "instance.json"
    info.write_text('{"isMaster": true, "instanceRole": "master"}')
    env = {
        "PATH": f"{bin_dir}:{tools}",
        "HOME": str(tmp_path),
        "RETRYLIB_INSTANCE_INFO": str(info),
        "RETRYLIB_ETC": str(tmp_path / "etc"),
        "RETRYLIB_HOME": str(tmp_path / "home"),
    }

    class Node:
        def __init__(self):
            self.bin, self.log, self.env, self.tmp = bin_dir, log, env, tmp_path
            self.python_stub = python_stub

        def python(self, name: str) -> None:
            _stub(bin_dir, name, python_stub)

        def calls(self) -> list[str]:
            return log.read_text().splitlines() if log.exists() else []

        def run(self, script: str, *args: str, **env: str) -> subprocess.CompletedProcess:
            return subprocess.run(
                ["bash", str(EMR / script), *args],
                env={**self.env, **env},
                capture_output=True,
                text=True,
                timeout=60,
            )

    return Node()


ARTIFACTS = "s3://bucket/artifacts"


def test_bootstrap_installs_into_python_3_11_and_records_it(node):
    """With no python3.11 on the node (AL2023 has only 3.9 as python3), dnf installs it;
    the wheels go in with their dependencies, Delta's package without (no PyPI pyspark)."""
    node.python("python3")  # AL2023's 3.9: must not be used
    result = node.run("bootstrap.sh", ARTIFACTS)
    assert result.returncode == 0, result.stderr
    calls = node.calls()
    assert "dnf install -y python3.11 python3.11-pip" in calls
    python = str(node.bin / "python3.11")
    assert (node.tmp / "etc" / "python").read_text().strip() == python
    pip_installs = [c for c in calls if c.startswith("python3.11 -m pip install")]
    assert len(pip_installs) == 2
    wheels, delta = pip_installs
    assert "--no-deps" not in wheels
    assert "retrylib-0.1.0-py3-none-any.whl" in wheels and "my_handlers-1.0" in wheels
    assert delta.endswith("--no-deps delta-spark==4.0.0")
    assert not [c for c in calls if c.startswith("python3 ")]
    assert not [c for c in calls if "pyspark" in c]
    assert (node.tmp / "home" / "jobs" / "run_job.py").is_file()
    assert (node.tmp / "home" / "deploy" / "emr" / "submit.sh").is_file()


def test_bootstrap_uses_an_installed_python_and_unpacks_nothing_on_a_core_node(node):
    node.python("python3.12")
    (node.tmp / "instance.json").write_text('{"isMaster": false, "instanceRole": "core"}')
    result = node.run("bootstrap.sh", ARTIFACTS, "python3.12")
    assert result.returncode == 0, result.stderr
    assert not [c for c in node.calls() if c.startswith("dnf")]
    assert (node.tmp / "etc" / "python").read_text().strip() == str(node.bin / "python3.12")
    assert not (node.tmp / "home").exists()


def test_bootstrap_refuses_a_python_older_than_3_11(node):
    node.python("python3.9")
    result = node.run("bootstrap.sh", ARTIFACTS, "python3.9")
    assert result.returncode == 1
    assert "is Python 3.9; retrylib needs 3.11 or newer" in result.stderr
    assert not [c for c in node.calls() if "pip install" in c]


def _spark_submit(node, exits: list[int], sleep: float = 0) -> Path:
    """A spark-submit that logs its arguments and PYSPARK_PYTHON, then exits with the next
    code of `exits` (after `sleep` seconds, as a job that runs a while)."""
    codes = node.tmp / "exits"
    codes.write_text("\n".join(map(str, exits)) + "\n")
    runs = node.tmp / "runs.log"
    _stub(
        node.bin,
        "spark-submit",
        f"""echo "PYSPARK_PYTHON=$PYSPARK_PYTHON $*" >> {runs}
code=$(head -n 1 {codes}); sed -i 1d {codes}
trap 'echo TERM >> {runs}; kill $! 2>/dev/null; exit 0' TERM
sleep {sleep} & wait $!
exit "$code"
""",
    )
    (node.tmp / "etc").mkdir(exist_ok=True)
    (node.tmp / "etc" / "python").write_text("/usr/bin/python3.11\n")
    home = node.tmp / "home" / "jobs"
    home.mkdir(parents=True, exist_ok=True)
    return runs


CONFIG = "s3://bucket/conf/orders.toml"
FAST = {"RETRYLIB_RESTART_DELAY": "0", "RETRYLIB_MAX_RESTARTS": "3"}


def test_submit_runs_spark_submit_with_the_bootstrapped_python_and_packages(node):
    runs = _spark_submit(node, [0])
    result = node.run("submit.sh", CONFIG, "--available-now", **FAST)
    assert result.returncode == 0, result.stderr
    (run,) = runs.read_text().splitlines()
    assert run.startswith("PYSPARK_PYTHON=/usr/bin/python3.11 ")
    args = run.split()[1:]
    assert args[args.index("--packages") + 1] == EMR_PACKAGES
    assert "spark.pyspark.python=/usr/bin/python3.11" in args
    assert args[args.index("--master") + 1] == "yarn"
    assert args[-3:] == [
        str(node.tmp / "home" / "jobs" / "run_job.py"),
        args[-2],
        "--available-now",
    ]
    assert args[-2].endswith("/orders.toml") and Path(args[-2]).is_file()


def test_submit_restarts_a_failed_run_until_it_ends_well(node):
    runs = _spark_submit(node, [1, 137, 0])
    result = node.run("submit.sh", CONFIG, **FAST)
    assert result.returncode == 0
    assert len(runs.read_text().splitlines()) == 3
    assert "restart 2 of 3" in result.stderr


def test_submit_gives_up_after_the_restarts_and_fails_the_step(node):
    runs = _spark_submit(node, [1] * 10)
    result = node.run("submit.sh", CONFIG, **FAST)
    assert result.returncode == 1
    assert len(runs.read_text().splitlines()) == 4
    assert "4 times in a row; giving up" in result.stderr


def test_submit_does_not_restart_an_invalid_config(node):
    runs = _spark_submit(node, [2, 0])
    result = node.run("submit.sh", CONFIG, **FAST)
    assert result.returncode == 2
    assert len(runs.read_text().splitlines()) == 1


@pytest.mark.parametrize("command", ["status", "redrive"])
def test_submit_runs_a_command_once_on_the_same_config_and_ends_with_its_code(node, command):
    """status-step.json and redrive-step.json: the command through spark-submit (a session
    of the cluster's Spark reads the tables), its options passed on, never restarted."""
    runs = _spark_submit(node, [1, 0])
    result = node.run("submit.sh", command, CONFIG, "--json", **FAST)
    assert result.returncode == 1, result.stderr
    (run,) = runs.read_text().splitlines()
    args = run.split()[1:]
    assert args[args.index("--packages") + 1] == EMR_PACKAGES
    assert args[-4:] == [
        str(node.tmp / "home" / "jobs" / "run_job.py"),
        command,
        args[-2],
        "--json",
    ]
    assert args[-2].endswith("/orders.toml") and Path(args[-2]).is_file()


def test_submit_passes_a_stop_on_and_does_not_restart(node):
    runs = _spark_submit(node, [0, 0], sleep=30)
    process = subprocess.Popen(
        ["bash", str(EMR / "submit.sh"), CONFIG],
        env={**node.env, **FAST},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 20
    while not (runs.exists() and runs.read_text()) and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.2)  # the stub's TERM trap is set right after its first line
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=20) == 0
    assert runs.read_text().splitlines()[1:] == ["TERM"]


def test_submit_needs_a_python_from_bootstrap(node):
    result = node.run("submit.sh", CONFIG)
    assert result.returncode == 2
    assert "run bootstrap.sh" in result.stderr


def test_submit_refuses_the_shipped_config_until_its_placeholders_are_edited(node):
    """deploy/emr/orders.toml's YOUR-... values (outside its comments) end the step with exit
    code 2 and the lines to edit, before any run; the same file edited runs."""
    runs = _spark_submit(node, [0])
    shipped = (EMR / "orders.toml").read_text()
    (node.tmp / "s3" / "conf" / "orders.toml").write_text(shipped)
    result = node.run("submit.sh", CONFIG, **FAST)
    assert result.returncode == 2
    assert "still holds placeholders" in result.stderr
    assert 'checkpoint = "s3://YOUR-BUCKET/' in result.stderr
    assert not runs.exists()
    edited = shipped.replace("s3://YOUR-BUCKET/", "s3://bucket/").replace("YOUR-BROKER-", "b")
    (node.tmp / "s3" / "conf" / "orders.toml").write_text(edited)
    result = node.run("submit.sh", CONFIG, **FAST)
    assert result.returncode == 0, result.stderr
    assert len(runs.read_text().splitlines()) == 1
