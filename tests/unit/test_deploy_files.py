"""The files in deploy/ against the formats their platforms document (the EMR scripts run with
stub commands: tests/integration/test_emr_scripts.py).

No Databricks workspace or EMR cluster is reachable here, so what is checked is what the
documentation requires of each file:

- Databricks asset bundle reference (keys of `bundle`, `variables`, `artifacts` with
  `type: whl`, `path` and `build`, `targets`, `resources.jobs`, `spark_python_task`,
  `libraries`, `job_clusters`/`new_cluster`, `continuous`, `spark_env_vars`):
  https://docs.databricks.com/en/dev-tools/bundles/reference.html
  https://docs.databricks.com/dev-tools/bundles/library-dependencies.html; a relative
  library path is uploaded, an absolute one taken as remote: databricks/cli
  bundle/libraries/local_path.go
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

import importlib.util
import json
import re
import tomllib
from pathlib import Path

import pytest
import yaml

from retrylib.config.loader import collect_config_errors

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
BUNDLE = DEPLOY / "databricks"
EMR = DEPLOY / "emr"


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


def _run_job():
    """deploy/databricks/src/run_job.py as a module (its __main__ part does not run)."""
    spec = importlib.util.spec_from_file_location("run_job", BUNDLE / "src" / "run_job.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


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
    pass, documented as built by them. The CLI uploads a relative path and takes an
    absolute one as a workspace path, so the handler's is a /Volumes or /Workspace path."""
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
    assert "/Volumes/" in handler["description"]
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


def test_run_job_sets_the_leading_environment_arguments_and_passes_the_rest_on():
    run_job = _run_job()
    env: dict[str, str] = {}
    secrets = []

    def secret(scope: str, key: str) -> str:
        secrets.append((scope, key))
        return "pw"

    rest = run_job.set_environment(
        ["--env=A=x=y", "--secret-env=B=scope/key", "c.toml", "--env=C=z", "--available-now"],
        env,
        secret,
    )
    assert env == {"A": "x=y", "B": "pw"}
    assert secrets == [("scope", "key")]
    assert rest == ["c.toml", "--env=C=z", "--available-now"]
    for bad in ("--env=A", "--env==hunter2", "--env=1A=hunter2", "--secret-env=B=hunter2"):
        with pytest.raises(run_job.UsageError) as raised:
            run_job.set_environment([bad], {}, secret)
        assert "hunter2" not in str(raised.value)


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
