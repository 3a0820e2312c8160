"""The EMR scripts in deploy/emr run with stub commands (`aws`, `sudo`, `dnf`, `python3.N`,
`spark-submit`) on PATH in a temp dir: no EMR cluster is reachable here. What the
documentation requires of the deploy files: tests/unit/test_deploy_files.py.

`submit.sh`'s interpreter (what bootstrap.sh recorded) is this project's own Python with
retrylib, so the config check it runs before a run is retrylib's real `check --offline`; a
stub spark-submit that starts the job's entry script with it, under a `pyspark` reporting
3.5.1, stands for an EMR 7 cluster.
"""

from __future__ import annotations

import shutil
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EMR = ROOT / "deploy" / "emr"

# Spark's Kafka connector at emr-spark-8.0.0's Spark (Delta is the cluster's own).
KAFKA_CONNECTOR = "org.apache.spark:spark-sql-kafka-0-10_2.13:4.0.2"
# deploy/emr/orders.toml with its placeholders edited: a config submit.sh lets run.
EDITED_CONFIG = (
    (EMR / "orders.toml")
    .read_text()
    .replace("YOUR-BUCKET", "bucket")
    .replace("YOUR-BROKER-", "broker-")
)


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
    (s3 / "artifacts" / "wheels" / "retrylib-0.2.0-py3-none-any.whl").write_text("")
    (s3 / "artifacts" / "wheels" / "my_handlers-1.0-py3-none-any.whl").write_text("")
    subprocess.run(
        ["tar", "-czf", str(s3 / "artifacts" / "retrylib-src.tar.gz"), "jobs", "deploy"],
        cwd=ROOT,
        check=True,
    )
    (s3 / "conf").mkdir()
    (s3 / "conf" / "orders.toml").write_text(EDITED_CONFIG)
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
    assert "retrylib-0.2.0-py3-none-any.whl" in wheels and "my_handlers-1.0" in wheels
    assert delta.endswith(" -m pip install --no-deps delta-spark==4.0.0")
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


def test_bootstrap_installs_from_a_wheel_folder_on_s3_without_an_index(node):
    """--wheels: a private subnet reaches S3 but no PyPI; every pip install finds its
    packages in the copied folder alone."""
    node.python("python3.11")
    wheelhouse = node.tmp / "s3" / "wheelhouse"
    wheelhouse.mkdir()
    (wheelhouse / "confluent_kafka-2.16.1-cp311-manylinux_2_28_x86_64.whl").write_text("")
    result = node.run("bootstrap.sh", "--wheels", "s3://bucket/wheelhouse/", ARTIFACTS)
    assert result.returncode == 0, result.stderr
    calls = node.calls()
    assert "aws s3 cp --recursive s3://bucket/wheelhouse/ " in "\n".join(calls)
    pip_installs = [c for c in calls if c.startswith("python3.11 -m pip install")]
    assert len(pip_installs) == 2
    for install in pip_installs:
        found = install.split()[install.split().index("--find-links") + 1]
        assert "--no-index" in install.split()
        assert (Path(found) / "confluent_kafka-2.16.1-cp311-manylinux_2_28_x86_64.whl").is_file()
    assert pip_installs[1].endswith("--no-deps delta-spark==4.0.0")


def _python(node) -> Path:
    """The interpreter bootstrap.sh would have recorded: this project's Python, with
    retrylib and the example handlers importable."""
    python = node.bin / "python3.11"
    python.write_text(
        f'#!/usr/bin/env bash\nexport PYTHONPATH="${{PYTHONPATH:-}}:{ROOT / "examples"}"\n'
        f'exec {sys.executable} "$@"\n'
    )
    python.chmod(0o755)
    (node.tmp / "etc").mkdir(exist_ok=True)
    (node.tmp / "etc" / "python").write_text(f"{python}\n")
    return python


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
    _python(node)
    home = node.tmp / "home" / "jobs"
    home.mkdir(parents=True, exist_ok=True)
    return runs


CONFIG = "s3://bucket/conf/orders.toml"
FAST = {"RETRYLIB_RESTART_DELAY": "0", "RETRYLIB_MAX_RESTARTS": "3"}


def test_submit_runs_spark_submit_with_the_bootstrapped_python_and_no_packages(node):
    """The default kafka.source reads with retrylib's own source: no connector, and Delta
    is the cluster's, so nothing is resolved from Maven."""
    runs = _spark_submit(node, [0])
    python = node.bin / "python3.11"
    result = node.run("submit.sh", CONFIG, "--available-now", **FAST)
    assert result.returncode == 0, result.stderr
    (run,) = runs.read_text().splitlines()
    assert run.startswith(f"PYSPARK_PYTHON={python} ")
    args = run.split()[1:]
    assert "--packages" not in args and "--jars" not in args
    assert f"spark.pyspark.python={python}" in args
    assert args[args.index("--master") + 1] == "yarn"
    assert args[-3:] == [
        str(node.tmp / "home" / "jobs" / "run_job.py"),
        args[-2],
        "--available-now",
    ]
    assert args[-2].endswith("/orders.toml") and Path(args[-2]).is_file()


def test_submit_adds_the_kafka_connector_for_the_builtin_source_only(node):
    runs = _spark_submit(node, [0])
    builtin = EDITED_CONFIG.replace('source = "auto"', 'source = "builtin"')
    assert builtin != EDITED_CONFIG
    (node.tmp / "s3" / "conf" / "orders.toml").write_text(builtin)
    result = node.run("submit.sh", CONFIG, **FAST)
    assert result.returncode == 0, result.stderr
    args = runs.read_text().split()[1:]
    assert args[args.index("--packages") + 1] == KAFKA_CONNECTOR


def test_submit_gives_the_users_jars_and_settings_as_spark_submit_sh_does(node):
    """RETRYLIB_SPARK_JARS and a --jars in RETRYLIB_SPARK_EXTRA as one --jars (spark-submit
    keeps the last), RETRYLIB_SPARK_CONF as --conf flags, the other extra flags kept."""
    runs = _spark_submit(node, [0])
    extras = {
        "RETRYLIB_SPARK_JARS": "s3://b/jars/a.jar",
        "RETRYLIB_SPARK_EXTRA": "--jars s3://b/jars/b.jar --conf spark.executor.instances=4",
        "RETRYLIB_SPARK_CONF": "spark.hadoop.fs.s3a.endpoint=http://127.0.0.1:9000",
    }
    result = node.run("submit.sh", CONFIG, **FAST, **extras)
    assert result.returncode == 0, result.stderr
    args = runs.read_text().split()[1:]
    assert args.count("--jars") == 1
    assert args[args.index("--jars") + 1] == "s3://b/jars/b.jar,s3://b/jars/a.jar"
    confs = {args[i + 1] for i, arg in enumerate(args) if arg == "--conf"}
    assert {
        "spark.hadoop.fs.s3a.endpoint=http://127.0.0.1:9000",
        "spark.executor.instances=4",
    } <= confs
    bad = node.run("submit.sh", CONFIG, **FAST, RETRYLIB_SPARK_CONF="endpoint")
    assert bad.returncode == 2 and "RETRYLIB_SPARK_CONF: 'endpoint'" in bad.stderr, bad.stderr


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
    assert "--packages" not in args
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
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert errors[0] == (
        "error: job.checkpoint: still holds the placeholder YOUR-BUCKET: "
        "replace it with your own value"
    )
    assert len(errors) == 5
    assert not runs.exists()
    (node.tmp / "s3" / "conf" / "orders.toml").write_text(EDITED_CONFIG)
    result = node.run("submit.sh", CONFIG, **FAST)
    assert result.returncode == 0, result.stderr
    assert len(runs.read_text().splitlines()) == 1


def test_an_emr_7_driver_is_refused_in_one_line_and_not_restarted(node):
    """A spark-submit that starts the job's entry script with the bootstrapped Python, where
    pyspark is 3.5.1 (EMR 7): one line naming the Spark needed, exit code 2, no restart."""
    shim = node.tmp / "spark-3.5" / "pyspark"
    shim.mkdir(parents=True)
    (shim / "__init__.py").write_text('__version__ = "3.5.1"\n')
    runs = node.tmp / "runs.log"
    _stub(
        node.bin,
        "spark-submit",
        f"""echo "$*" >> {runs}
while [[ $1 != *.py ]]; do shift; done
PYTHONPATH={shim.parent} exec "$PYSPARK_PYTHON" "$@"
""",
    )
    _python(node)
    (node.tmp / "home" / "jobs").mkdir(parents=True)
    shutil.copy(ROOT / "jobs" / "run_job.py", node.tmp / "home" / "jobs" / "run_job.py")
    for command in ([], ["status"]):
        result = node.run("submit.sh", *command, CONFIG, **FAST)
        assert result.returncode == 2, result.stderr
        lines = [line for line in result.stderr.splitlines() if "error" in line.lower()]
        assert lines == [
            "error: retrylib needs Spark 4.0 or newer; this driver's pyspark is 3.5.1 "
            "(on EMR, a release with Spark 4: emr-spark-8.0.0 or newer)"
        ]
        assert "Traceback" not in result.stderr
    assert len(runs.read_text().splitlines()) == 2  # one run each, nothing restarted
