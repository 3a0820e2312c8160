"""The files in deploy/ against the formats their platforms document, and the EMR scripts run.

No Databricks workspace or EMR cluster is reachable here, so what is checked is what the
documentation requires of each file, and what the shell scripts do when run with stub
commands (`aws`, `sudo`, `dnf`, `python3.N`, `spark-submit`) on PATH in a temp dir:

- Databricks asset bundle reference (keys of `bundle`, `variables`, `artifacts` with
  `type: whl`, `path` and `build`, `targets`, `resources.jobs`, `spark_python_task`,
  `libraries`, `job_clusters`/`new_cluster`, `continuous`, `spark_env_vars`):
  https://docs.databricks.com/en/dev-tools/bundles/reference.html
  https://docs.databricks.com/dev-tools/bundles/library-dependencies.html
- Continuous jobs: one run at a time, a new run after a failure with exponential backoff,
  no retry policies: https://docs.databricks.com/jobs/continuous.html
- `aws emr add-steps --steps file://step.json` reads the CLI's step form (`Type`,
  `Name`, `ActionOnFailure`, `Jar` required for CUSTOM_JAR, `Args`), which it turns into
  the API's StepConfig (`HadoopJarStep.Jar/Args`): aws-cli
  awscli/customizations/emr/steputils.py (build_custom_jar_step);
  ActionOnFailure values: https://docs.aws.amazon.com/emr/latest/APIReference/API_StepConfig.html
- Bootstrap actions run on every node before EMR installs its applications:
  https://docs.aws.amazon.com/emr/latest/ManagementGuide/emr-plan-bootstrap.html
- AL2023's /usr/bin/python3 is Python 3.9 for the life of AL2023; python3.11 and newer
  are packages of their own: https://docs.aws.amazon.com/linux/al2023/ug/python.html
- emr-spark-8.0.0 is Spark 4.0.2-amzn-0, Scala 2.13, Delta 4.0.0:
  https://docs.aws.amazon.com/emr/latest/ReleaseGuide/emr-spark800-release.html
"""

from __future__ import annotations

import json
import re
import shutil
import signal
import stat
import subprocess
import time
import tomllib
from pathlib import Path

import pytest
import yaml

from retrylib.config.loader import collect_config_errors

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
BUNDLE = DEPLOY / "databricks"
EMR = DEPLOY / "emr"

# Delta 4.0.0 is the version on emr-spark-8.0.0; its Scala 2.13 jar has no Spark-line suffix.
EMR_PACKAGES = "org.apache.spark:spark-sql-kafka-0-10_2.13:4.0.2,io.delta:delta-spark_2.13:4.0.0"


def _yaml(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


def _bundle() -> dict:
    """databricks.yml with its `include`d files merged in, as the CLI reads them."""
    root = _yaml(BUNDLE / "databricks.yml")
    for pattern in root.get("include", []):
        for path in sorted(BUNDLE.glob(pattern)):
            for key, value in _yaml(path).items():
                root.setdefault(key, {}).update(value)
    return root


def _job() -> dict:
    jobs = _bundle()["resources"]["jobs"]
    assert list(jobs) == ["retrylib_orders"]
    return jobs["retrylib_orders"]


# --- Databricks asset bundle -------------------------------------------------------------

BUNDLE_TOP_LEVEL = {
    "bundle", "include", "variables", "artifacts", "targets", "resources", "sync",
    "workspace", "permissions", "run_as", "experimental", "presets", "scripts",
}  # fmt: skip
ARTIFACT_KEYS = {"type", "path", "build", "files", "executable", "dynamic_version"}
VARIABLE_KEYS = {"description", "default", "type", "lookup"}
NEW_CLUSTER_REQUIRED = {"spark_version", "node_type_id"}
DATA_SECURITY_MODES = {
    "NONE", "SINGLE_USER", "USER_ISOLATION", "DATA_SECURITY_MODE_DEDICATED",
    "DATA_SECURITY_MODE_STANDARD", "DATA_SECURITY_MODE_AUTO",
}  # fmt: skip
# delta-rs needed these in the Python processes; Spark's Delta writer uses the cluster's own.
CREDENTIAL_VARIABLES = re.compile(
    r"^(AWS_|AZURE_|GOOGLE_|DELTA_DYNAMO|ARM_)|SECRET_ACCESS_KEY|ACCESS_KEY_ID|LOCKING_PROVIDER"
)


def test_bundle_uses_only_documented_top_level_keys_and_names_itself():
    bundle = _bundle()
    assert set(bundle) <= BUNDLE_TOP_LEVEL
    assert bundle["bundle"]["name"]
    for name, variable in bundle["variables"].items():
        assert set(variable) <= VARIABLE_KEYS, name
        assert variable.get("description"), f"variable {name} has no description"


def test_every_variable_used_is_declared_and_every_declared_one_is_used():
    text = "\n".join(p.read_text() for p in BUNDLE.rglob("*.yml"))
    used = set(re.findall(r"\$\{var\.([a-z_]+)\}", text))
    assert used == set(_bundle()["variables"])


def test_the_artifact_builds_the_repository_wheel():
    artifacts = _bundle()["artifacts"]
    assert set(artifacts) == {"retrylib"}
    artifact = artifacts["retrylib"]
    assert set(artifact) <= ARTIFACT_KEYS
    assert artifact["type"] == "whl"
    project = (BUNDLE / artifact["path"]).resolve()
    assert project == ROOT
    assert (project / "pyproject.toml").is_file()
    assert artifact["build"].split() == ["python", "-m", "build", "--wheel"]


def test_every_wheel_the_job_installs_is_built_by_an_artifact_or_by_the_user():
    """A local wheel must come out of an artifact's build (`<path>/dist/<project>-*.whl`);
    the only other one is the handler's, a variable with no default that the user must
    pass, documented as built by them."""
    bundle = _bundle()
    built = set()
    for artifact in bundle["artifacts"].values():
        project = (BUNDLE / artifact["path"]).resolve()
        name = tomllib.loads((project / "pyproject.toml").read_text())["project"]["name"]
        built.add(project / "dist" / f"{name.replace('-', '_')}-*.whl")
    (task,) = _job()["tasks"]
    wheels = [library["whl"] for library in task["libraries"]]
    assert wheels == ["../../../dist/retrylib-*.whl", "${var.handler_wheel}"]
    resources = BUNDLE / "resources"
    assert (resources / wheels[0]).resolve() in built
    handler = bundle["variables"]["handler_wheel"]
    assert "default" not in handler
    assert "you build" in handler["description"]
    assert "handler_wheel" in (DEPLOY / "README.md").read_text()


def test_the_task_runs_the_entry_point_with_the_synced_config():
    (task,) = _job()["tasks"]
    python_task = task["spark_python_task"]
    assert set(python_task) <= {"python_file", "parameters", "source"}
    entry = (BUNDLE / "resources" / python_task["python_file"]).resolve()
    assert entry == BUNDLE / "src" / "run_job.py"
    assert "retrylib.ops.cli import main" in entry.read_text()
    assert python_task["parameters"] == ["${workspace.file_path}/conf/orders.toml"]
    assert (BUNDLE / "conf" / "orders.toml").is_file()


def test_the_job_cluster_is_a_documented_new_cluster_without_storage_credentials():
    job = _job()
    (cluster,) = job["job_clusters"]
    (task,) = job["tasks"]
    assert task["job_cluster_key"] == cluster["job_cluster_key"]
    new_cluster = cluster["new_cluster"]
    assert NEW_CLUSTER_REQUIRED <= set(new_cluster)
    assert "num_workers" in new_cluster or "autoscale" in new_cluster
    assert new_cluster["data_security_mode"] in DATA_SECURITY_MODES
    env = new_cluster["spark_env_vars"]
    assert not [name for name in env if CREDENTIAL_VARIABLES.search(name)]
    secret = env["RETRYLIB_KAFKA_PASSWORD"]
    assert re.fullmatch(r"\{\{secrets/[^/]+/[^/]+\}\}", secret.replace("${var.secret_scope}", "s"))


def test_a_failed_run_is_restarted_by_the_continuous_trigger():
    """Continuous: the platform restarts failed runs; retry policies are not allowed with it
    and neither is a schedule. Deployed paused, running once unpaused in prod."""
    job = _job()
    assert job["continuous"]["pause_status"] in {"PAUSED", "UNPAUSED"}
    assert not {"schedule", "trigger"} & set(job)
    (task,) = job["tasks"]
    assert not {"max_retries", "min_retry_interval_millis", "depends_on"} & set(task)
    prod = _bundle()["targets"]["prod"]
    assert prod["mode"] == "production"
    assert prod["resources"]["jobs"]["retrylib_orders"]["continuous"] == {
        "pause_status": "UNPAUSED"
    }


def test_the_bundle_config_is_valid_with_the_cluster_environment(monkeypatch):
    for name, value in {
        "RETRYLIB_KAFKA_BOOTSTRAP_SERVERS": "broker-1:9092",
        "RETRYLIB_STORAGE_ROOT": "s3://bucket/retrylib/orders",
        "RETRYLIB_KAFKA_PASSWORD": "secret",
    }.items():
        monkeypatch.setenv(name, value)
    monkeypatch.syspath_prepend(str(ROOT))
    assert collect_config_errors(BUNDLE / "conf" / "orders.toml") == []
    env = set(_job()["job_clusters"][0]["new_cluster"]["spark_env_vars"])
    used = set(re.findall(r"\$\{env:([A-Z_]+)\}", (BUNDLE / "conf" / "orders.toml").read_text()))
    assert used <= env


# --- Every file in deploy/ ---------------------------------------------------------------

OBSOLETE = re.compile(
    r"deltalake|delta-rs|dynamodb|LOCKING_PROVIDER|ALLOW_UNSAFE_RENAME|noida|"
    r"pyarrow's file systems|retrylib/(jars|storage|status|redrive|cli)\.py",
    re.IGNORECASE,
)


def test_no_file_in_deploy_gives_advice_of_the_delta_rs_era():
    found = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for path in sorted(DEPLOY.rglob("*"))
        if path.is_file()
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if OBSOLETE.search(line)
    ]
    assert found == []


def test_paths_named_in_deploy_readme_exist():
    text = (DEPLOY / "README.md").read_text()
    named = set(re.findall(r"`((?:deploy|retrylib|jobs|tests)/[\w/-]+\.\w+)`", text))
    assert named, "the README names no repository path"
    missing = [path for path in sorted(named) if not (ROOT / path).exists()]
    assert missing == []


@pytest.mark.parametrize("script", ["bootstrap.sh", "submit.sh"])
def test_emr_scripts_parse_and_are_executable(script):
    path = EMR / script
    subprocess.run(["bash", "-n", str(path)], check=True)
    assert path.stat().st_mode & stat.S_IXUSR


# --- EMR step ----------------------------------------------------------------------------

STEP_KEYS = {"Type", "Name", "ActionOnFailure", "Jar", "Args", "MainClass", "Properties"}
ACTIONS_ON_FAILURE = {"TERMINATE_JOB_FLOW", "TERMINATE_CLUSTER", "CANCEL_AND_WAIT", "CONTINUE"}


def test_step_is_what_aws_emr_add_steps_reads_from_a_file():
    (step,) = json.loads((EMR / "step.json").read_text())
    assert set(step) <= STEP_KEYS
    assert step["Type"] == "CUSTOM_JAR"
    assert 0 < len(step["Name"]) <= 256
    assert step["ActionOnFailure"] in ACTIONS_ON_FAILURE
    # A long-running stream must not take the cluster down, or cancel later steps, when it
    # fails for good: submit.sh already restarted it.
    assert step["ActionOnFailure"] == "CONTINUE"
    assert step["Jar"] == "command-runner.jar"
    bash, script, config = step["Args"]
    assert bash == "bash"
    # bootstrap.sh unpacks the repository into /home/hadoop/retrylib on the primary node.
    assert script.startswith("/home/hadoop/retrylib/")
    assert (ROOT / script.removeprefix("/home/hadoop/retrylib/")).is_file()
    assert config.startswith("s3://")


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
