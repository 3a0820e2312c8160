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
- Jobs on serverless compute: no cluster; a Python script task needs `environment_key`,
  naming one of the job's `environments` (`environment_key`, `spec`):
  https://docs.databricks.com/dev-tools/bundles/resource-examples.html; the spec's fields
  (`environment_version`, or `base_environment`; `client` is deprecated for
  `environment_version`; `dependencies` are pip requirement lines, wheel paths among them):
  https://databricks.github.io/sdk-js/api/interfaces/_databricks_sdk-jobs.v2.Environment.html;
  the bundle CLI uploads a local wheel (a relative path or glob) named in `dependencies` as
  in `libraries`: databricks/cli acceptance/bundle/environments/dependencies.
  Environment versions (4: Python 3.12, Databricks Connect 17):
  https://docs.databricks.com/aws/release-notes/serverless/environment-version
- Serverless streaming runs only incremental batches (no default or time-based trigger),
  Spark Connect APIs only, Unity Catalog for storage:
  https://docs.databricks.com/compute/serverless/limitations.html
- Environment variables for serverless jobs exist only as a Beta (a workspace preview,
  environment version 5 or newer, set through the Jobs API): not used; the task passes
  them as parameters: https://docs.databricks.com/aws/en/jobs/environment-variables;
  secrets in a Python task: dbutils.secrets.get, as in databricks/bundle-examples
  knowledge_base/job_read_secret; `databricks.sdk.runtime.dbutils`:
  https://databricks-sdk-py.readthedocs.io/en/latest/dbutils.html
- `schedule` (`quartz_cron_expression` and `timezone_id` required, `pause_status` PAUSED or
  UNPAUSED): https://docs.databricks.com/jobs/scheduled.html,
  https://databricks.github.io/sdk-js/api/interfaces/_databricks_sdk-jobs.v2.CronSchedule.html;
  Quartz cron fields (seconds first; `?` in day-of-month or day-of-week):
  http://www.quartz-scheduler.org/documentation/quartz-2.3.0/tutorials/crontrigger.html
- `max_concurrent_runs` (one active run by default; a run over the limit is skipped):
  https://docs.databricks.com/jobs/triggers
- `data_security_mode` values (DATA_SECURITY_MODE_STANDARD, with USER_ISOLATION its legacy
  alias; DATA_SECURITY_MODE_DEDICATED, with SINGLE_USER):
  https://databricks.github.io/sdk-js/api/types/_databricks_sdk-jobs.v2.DataSecurityMode.html
- Standard access mode: no spark-submit tasks, no SparkContext (Spark Connect):
  https://docs.databricks.com/compute/access-mode-limitations.html,
  https://learn.microsoft.com/en-us/azure/databricks/error-messages/unsupported-connect-feature-error-class
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
- The step and cluster files are also put through the platforms' own code, offline: the
  step files through aws-cli's conversion of `add-steps --steps file://` (steputils) into
  an AddJobFlowSteps request, that and cluster.json (a RunJobFlow request) through
  botocore's parameter validation against EMR's service model; each job of the bundle
  through the Jobs API's own model (databricks-sdk's `JobSettings.from_dict`), which drops
  what it does not know, so a round trip that loses a key finds a misspelt one.
- EMR runs one step at a time unless the cluster sets `StepConcurrencyLevel` (RunJobFlow);
  `delta-defaults` with `delta.enabled` puts EMR's Delta jars (delta-spark, delta-storage,
  delta-storage-s3-dynamodb under /usr/share/aws/delta/lib) on Spark's class path:
  https://docs.aws.amazon.com/emr/latest/ReleaseGuide/Deltausing-cluster-spark.html
- Delta's multi-cluster S3 log store (`S3DynamoDBLogStore`, its `ddb.tableName` and
  `ddb.region`): https://docs.delta.io/latest/delta-storage.html#multi-cluster-setup
- `mode: production` targets: the CLI refuses one without `workspace.root_path` (a warning
  only when a service principal deploys or every job names `run_as`: databricks/cli
  validate_target_mode.go), and production jobs should name `run_as`:
  https://docs.databricks.com/dev-tools/bundles/deployment-modes.html,
  https://docs.databricks.com/dev-tools/bundles/run-as.html; `dynamic_version` on a whl
  artifact patches the wheel's version on every deploy so a changed wheel is never taken
  for a cached one: https://docs.databricks.com/dev-tools/bundles/reference.html
"""

from __future__ import annotations

import importlib.util
import json
import re
import tomllib
from pathlib import Path

import botocore.session
import pytest
import yaml
from awscli.customizations.emr.steputils import build_step_config_list
from botocore.validate import ParamValidator
from databricks.sdk.service.jobs import JobRunAs, JobSettings

from retrylib.config.loader import collect_config_errors

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
BUNDLE = DEPLOY / "databricks"
EMR = DEPLOY / "emr"


def _yaml(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


def _merge(into: dict, new: dict, where: str) -> None:
    """Merge `new` into `into` key by key; a value defined twice is an error, as for the CLI."""
    for key, value in new.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge(into[key], value, f"{where}.{key}")
        else:
            assert key not in into, f"{where}.{key} is defined twice"
            into[key] = value


def _bundle() -> dict:
    """databricks.yml with its `include`d files merged in, as the CLI reads them."""
    root = _yaml(BUNDLE / "databricks.yml")
    for pattern in root.get("include", []):
        for path in sorted(BUNDLE.glob(pattern)):
            _merge(root, _yaml(path), path.name)
    return root


# The same job on three kinds of compute: the key of each, and how it runs.
DEDICATED = "retrylib_orders"
STANDARD = "retrylib_orders_standard"
SERVERLESS = "retrylib_orders_serverless"
CLUSTER_JOBS = (DEDICATED, STANDARD)  # continuous, on a job cluster of their own
# `retrylib status` and `retrylib redrive` on the same config, run by hand, serverless.
TOOL_JOBS = {"retrylib_orders_status": ["status"], "retrylib_orders_redrive": ["redrive"]}


def _job(name: str = DEDICATED) -> dict:
    jobs = _bundle()["resources"]["jobs"]
    assert set(jobs) == {DEDICATED, STANDARD, SERVERLESS, *TOOL_JOBS}
    return jobs[name]


def _task(name: str) -> dict:
    (task,) = _job(name)["tasks"]
    return task


def _default(value: str) -> str:
    """`value` with each ${var.NAME} replaced by the variable's default."""
    variables = _bundle()["variables"]
    return re.sub(r"\$\{var\.([a-z_]+)\}", lambda m: variables[m[1]]["default"], value)


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
DEDICATED_MODES = {"DATA_SECURITY_MODE_DEDICATED", "SINGLE_USER"}
STANDARD_MODES = {"DATA_SECURITY_MODE_STANDARD", "USER_ISOLATION"}
ENVIRONMENT_SPEC_KEYS = {
    "environment_version", "base_environment", "client", "dependencies", "java_dependencies",
}  # fmt: skip
SCHEDULE_KEYS = {"quartz_cron_expression", "timezone_id", "pause_status"}
# A task runs on the cluster these name, or on serverless compute when it names none.
CLUSTER_KEYS = {"job_cluster_key", "new_cluster", "existing_cluster_id"}
WHEELS = ["../../../dist/retrylib-*.whl", "../../../examples/dist/orders_handlers-*.whl"]
SYNCED_CONFIG = re.compile(r"\$\{workspace\.file_path\}/(conf/[\w.-]+\.toml)")
# delta-rs needed these in the Python processes; Spark's Delta writer uses the cluster's own.
CREDENTIAL_VARIABLES = re.compile(
    r"^(AWS_|AZURE_|GOOGLE_|DELTA_DYNAMO|ARM_)|SECRET_ACCESS_KEY|ACCESS_KEY_ID|LOCKING_PROVIDER"
)
SECRET_REFERENCE = re.compile(r"\{\{secrets/[^/]+/[^/]+\}\}")


def _run_job():
    """deploy/databricks/src/run_job.py as a module (its __main__ part does not run)."""
    spec = importlib.util.spec_from_file_location("run_job", BUNDLE / "src" / "run_job.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _wheels(name: str) -> list[str]:
    """What a job installs: its task's libraries on a cluster, the dependencies of its
    task's environment on serverless compute."""
    task = _task(name)
    if "environment_key" not in task:
        return [library["whl"] for library in task["libraries"]]
    environments = _job(name)["environments"]
    (spec,) = [e["spec"] for e in environments if e["environment_key"] == task["environment_key"]]
    return spec["dependencies"]


def _environment(name: str) -> tuple[dict[str, str], list[str]]:
    """The environment a job's `retrylib run` gets (a secret read by run_job.py shows as
    `secret:SCOPE/KEY`), and the arguments run_job.py passes on to it."""
    task = _task(name)
    parameters = task["spark_python_task"]["parameters"]
    if "environment_key" not in task:
        (cluster,) = _job(name)["job_clusters"]
        return dict(cluster["new_cluster"]["spark_env_vars"]), parameters
    env: dict[str, str] = {}
    rest = _run_job().set_environment(parameters, env, lambda scope, key: f"secret:{scope}/{key}")
    return env, rest


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


def test_the_artifacts_build_the_repository_wheel_and_the_example_handlers():
    artifacts = _bundle()["artifacts"]
    assert set(artifacts) == {"retrylib", "handlers"}
    projects = {}
    for name, artifact in artifacts.items():
        assert set(artifact) <= ARTIFACT_KEYS
        assert artifact["type"] == "whl"
        projects[name] = (BUNDLE / artifact["path"]).resolve()
        assert (projects[name] / "pyproject.toml").is_file()
        assert artifact["build"].split() == ["python", "-m", "build", "--wheel"]
        # A new wheel version on every deploy: a changed wheel is never taken for a cached one.
        assert artifact["dynamic_version"] is True, name
    assert projects == {"retrylib": ROOT, "handlers": ROOT / "examples"}


def test_every_wheel_a_job_installs_is_built_by_an_artifact():
    """Each comes out of an artifact's build (`<path>/dist/<project>-*.whl`): retrylib's, and
    the handler package the config names, so the bundle deploys as written."""
    bundle = _bundle()
    built = set()
    for artifact in bundle["artifacts"].values():
        project = (BUNDLE / artifact["path"]).resolve()
        name = tomllib.loads((project / "pyproject.toml").read_text())["project"]["name"]
        built.add(project / "dist" / f"{name.replace('-', '_')}-*.whl")
    for job in (DEDICATED, STANDARD, SERVERLESS):
        wheels = _wheels(job)
        assert wheels == WHEELS, job
        assert {(BUNDLE / "resources" / wheel).resolve() for wheel in wheels} == built
    handler = tomllib.loads((BUNDLE / "conf" / "orders.toml").read_text())["handler"]
    assert handler["function"].split(".")[0] == "orders_handlers"
    assert (ROOT / "examples" / "orders_handlers" / "__init__.py").is_file()


def test_every_variable_has_a_value_in_every_target_so_validate_passes_as_written():
    """`databricks bundle validate` (and run) stop on a variable without a value. Those only
    the user can know are YOUR-... placeholders, which run_job.py refuses at start."""
    bundle = _bundle()
    for target, spec in bundle["targets"].items():
        given = set((spec or {}).get("variables", {}))
        for name, variable in bundle["variables"].items():
            assert "default" in variable or name in given, f"{name} has no value in {target}"
    placeholders = {
        name for name, variable in bundle["variables"].items() if "YOUR-" in variable["default"]
    }
    assert placeholders == {"kafka_bootstrap_servers", "storage_root", "checkpoint_root"}
    readme = (DEPLOY / "README.md").read_text()
    for name in placeholders:
        assert f"--var {name}=" in readme, name


def test_run_job_refuses_a_placeholder_naming_the_variable_to_give():
    run_job = _run_job()
    env, _ = _environment(DEDICATED)
    defaults = {name: _default(value) for name, value in env.items()}
    lines = run_job.placeholder_errors(defaults)
    assert [line.split(" ")[0] for line in lines] == [
        "RETRYLIB_CHECKPOINT_ROOT", "RETRYLIB_KAFKA_BOOTSTRAP_SERVERS", "RETRYLIB_STORAGE_ROOT",
    ]  # fmt: skip
    assert "--var kafka_bootstrap_servers=<yours>" in lines[1]
    given = {**defaults, "RETRYLIB_KAFKA_BOOTSTRAP_SERVERS": "b:9092"}
    given |= {"RETRYLIB_STORAGE_ROOT": "s3://b/r", "RETRYLIB_CHECKPOINT_ROOT": "/Volumes/m/r/c"}
    assert run_job.placeholder_errors(given) == []


def test_every_task_runs_the_entry_point_with_a_synced_config():
    """A Python file task (standard access mode runs no spark-submit task) running
    run_job.py with a config the bundle syncs; the serverless one with --available-now."""
    for job in (DEDICATED, STANDARD, SERVERLESS):
        task = _task(job)
        assert "spark_submit_task" not in task
        python_task = task["spark_python_task"]
        assert set(python_task) <= {"python_file", "parameters", "source"}
        entry = (BUNDLE / "resources" / python_task["python_file"]).resolve()
        assert entry == BUNDLE / "src" / "run_job.py"
        assert "retrylib.ops.cli import script_main" in entry.read_text()
        config, *flags = _environment(job)[1]
        assert flags == (["--available-now"] if job == SERVERLESS else []), job
        synced = SYNCED_CONFIG.fullmatch(config)
        assert synced, f"{job}: {config} is not a config synced with the bundle"
        assert (BUNDLE / synced[1]).is_file(), job


def test_the_job_clusters_are_documented_new_clusters_without_storage_credentials():
    for job in CLUSTER_JOBS:
        (cluster,) = _job(job)["job_clusters"]
        assert _task(job)["job_cluster_key"] == cluster["job_cluster_key"]
        new_cluster = cluster["new_cluster"]
        assert NEW_CLUSTER_REQUIRED <= set(new_cluster)
        assert "num_workers" in new_cluster or "autoscale" in new_cluster
        assert new_cluster["data_security_mode"] in DATA_SECURITY_MODES
        env = new_cluster["spark_env_vars"]
        assert not [name for name in env if CREDENTIAL_VARIABLES.search(name)]
        secret = env["RETRYLIB_KAFKA_PASSWORD"].replace("${var.secret_scope}", "s")
        assert SECRET_REFERENCE.fullmatch(secret), job
    mode = {
        job: _job(job)["job_clusters"][0]["new_cluster"]["data_security_mode"]
        for job in CLUSTER_JOBS
    }
    assert mode[DEDICATED] in DEDICATED_MODES
    assert mode[STANDARD] in STANDARD_MODES


def test_the_standard_job_is_the_dedicated_one_in_standard_access_mode():
    """Same task, libraries, cluster and trigger: only the name and the access mode differ."""

    def without_mode(job: str) -> dict:
        settings = json.loads(json.dumps(_job(job)))
        del settings["name"]
        for cluster in settings["job_clusters"]:
            del cluster["new_cluster"]["data_security_mode"]
        return settings

    assert _job(STANDARD)["name"] != _job(DEDICATED)["name"]
    assert without_mode(STANDARD) == without_mode(DEDICATED)


def test_a_failed_run_is_restarted_by_the_continuous_trigger():
    """Continuous: the platform restarts failed runs; retry policies are not allowed with it
    and neither is a schedule. Deployed paused."""
    for job in CLUSTER_JOBS:
        settings = _job(job)
        assert settings["continuous"] == {"pause_status": "PAUSED"}, job
        assert not {"schedule", "trigger"} & set(settings)
        task = _task(job)
        assert not {"max_retries", "min_retry_interval_millis", "depends_on"} & set(task)


def test_the_serverless_job_names_no_cluster_and_a_documented_environment():
    job = _job(SERVERLESS)
    task = _task(SERVERLESS)
    assert "job_clusters" not in job
    assert not CLUSTER_KEYS & set(task)
    assert "libraries" not in task  # installed through the environment
    assert "spark_env_vars" not in json.dumps(job)
    keys = [environment["environment_key"] for environment in job["environments"]]
    assert len(keys) == len(set(keys))
    assert task["environment_key"] in keys
    for environment in job["environments"]:
        assert set(environment) == {"environment_key", "spec"}
        spec = environment["spec"]
        assert set(spec) <= ENVIRONMENT_SPEC_KEYS
        assert "client" not in spec  # deprecated: environment_version
        version = _default(spec["environment_version"])
        # 4 and newer: Python 3.12 and a Spark 4 client, as retrylib needs.
        assert version.isdigit() and int(version) >= 4, version


def test_the_serverless_job_runs_available_now_on_a_quartz_schedule():
    """Serverless streaming takes availableNow only: each run ends, the schedule starts the
    next. Quartz: seconds minutes hours day-of-month month day-of-week [year], with `?` in
    exactly one of the two days. Deployed paused."""
    job = _job(SERVERLESS)
    assert not {"continuous", "trigger"} & set(job)
    assert "--available-now" in _task(SERVERLESS)["spark_python_task"]["parameters"]
    schedule = job["schedule"]
    assert set(schedule) == SCHEDULE_KEYS
    assert schedule["pause_status"] == "PAUSED"
    assert schedule["timezone_id"] == "UTC"
    fields = _default(schedule["quartz_cron_expression"]).split()
    assert len(fields) in (6, 7), fields
    assert (fields[3] == "?") != (fields[5] == "?"), fields
    assert fields[:3] == ["0", "0/15", "*"], "the default: every 15 minutes"


def test_the_status_and_redrive_jobs_run_the_command_on_the_job_s_config_by_hand():
    """What the serverless job installs and is given, the command before the config; never
    scheduled or continuous; the redrive a dry run until edited."""
    serverless_env, (job_config, _) = _environment(SERVERLESS)
    for job, command in TOOL_JOBS.items():
        assert not {"continuous", "schedule", "trigger"} & set(_job(job)), job
        assert _wheels(job) == WHEELS, job
        env, arguments = _environment(job)
        assert env == {k: v for k, v in serverless_env.items() if k != "RETRYLIB_LOG_FORMAT"}
        assert arguments[:2] == [*command, job_config], job
        assert arguments[2:] == (["--dry-run"] if command == ["redrive"] else []), job
        assert _task(job)["spark_python_task"]["python_file"] == "../src/run_job.py"
        assert f"databricks bundle run -t dev {job}" in (DEPLOY / "README.md").read_text()


def test_every_job_runs_one_copy_at_a_time():
    for job in (DEDICATED, STANDARD, SERVERLESS, *TOOL_JOBS):
        assert _job(job)["max_concurrent_runs"] == 1, job


def test_each_prod_target_unpauses_one_job_and_dev_none():
    """The three jobs share a config, so a checkpoint: a prod target starts one of them."""
    targets = _bundle()["targets"]
    assert targets["dev"] == {"mode": "development", "default": True}
    unpaused = {
        "prod": (DEDICATED, "continuous"),
        "prod-standard": (STANDARD, "continuous"),
        "prod-serverless": (SERVERLESS, "schedule"),
    }
    assert set(targets) == {"dev", *unpaused}
    for target, (job, trigger) in unpaused.items():
        assert targets[target]["mode"] == "production"
        assert targets[target]["resources"] == {
            "jobs": {job: {trigger: {"pause_status": "UNPAUSED"}}}
        }, target


PROD_ROOT_PATH = (
    "/Workspace/Users/${workspace.current_user.userName}/.bundle/${bundle.name}/${bundle.target}"
)


def test_each_prod_target_names_its_root_path_and_who_its_jobs_run_as():
    """The CLI refuses a `mode: production` target without `workspace.root_path` (a warning
    only when a service principal deploys or every job names run_as); `run_as` keeps the
    jobs' identity from being whoever deployed last. It is a variable, the deploying user by
    default."""
    bundle = _bundle()
    prod = {name: t for name, t in bundle["targets"].items() if t["mode"] == "production"}
    assert set(prod) == {"prod", "prod-standard", "prod-serverless"}
    for name, target in prod.items():
        assert target["workspace"] == {"root_path": PROD_ROOT_PATH}, name
        assert target["run_as"] == {"user_name": "${var.run_as_user}"}, name
        assert JobRunAs.from_dict(target["run_as"]).as_dict() == target["run_as"]
    assert bundle["variables"]["run_as_user"]["default"] == "${workspace.current_user.userName}"
    assert "--var run_as_user=" in (DEPLOY / "README.md").read_text()


# Sample values for what the CLI fills in at deploy.
BUNDLE_FIELDS = {"${workspace.file_path}": "/Workspace/Users/me@example.com/.bundle/r/dev/files"}


@pytest.mark.parametrize(
    "path", sorted((BUNDLE / "resources").glob("*.yml")), ids=lambda path: path.name
)
def test_every_job_loads_into_the_jobs_api_model_keeping_every_key(path):
    """Each job, its variables at their defaults, through databricks-sdk's JobSettings: a
    key the Jobs API does not know is dropped on the way, so the round trip finds it."""
    text = _default(path.read_text())
    for field, value in BUNDLE_FIELDS.items():
        text = text.replace(field, value)
    for name, job in yaml.safe_load(text)["resources"]["jobs"].items():
        assert "${" not in json.dumps(job), name
        assert JobSettings.from_dict(job).as_dict() == job, name


def test_the_bundle_config_is_valid_with_each_jobs_environment(monkeypatch):
    used = set(re.findall(r"\$\{env:([A-Z_]+)\}", (BUNDLE / "conf" / "orders.toml").read_text()))
    checkpoints = set()
    for job in (DEDICATED, STANDARD, SERVERLESS):
        env = _environment(job)[0]
        assert used <= set(env), job
        checkpoints.add(env["RETRYLIB_CHECKPOINT_ROOT"])
        password = env["RETRYLIB_KAFKA_PASSWORD"].replace("${var.secret_scope}", "s")
        assert SECRET_REFERENCE.fullmatch(password) or password == "secret:s/kafka-password"
        assert env["RETRYLIB_LOG_FORMAT"] == "json"
    for name, value in {
        "RETRYLIB_KAFKA_BOOTSTRAP_SERVERS": "broker-1:9092",
        "RETRYLIB_STORAGE_ROOT": "s3://bucket/retrylib/orders",
        "RETRYLIB_CHECKPOINT_ROOT": "/Volumes/main/retrylib/checkpoints",
        "RETRYLIB_KAFKA_PASSWORD": "secret",
    }.items():
        monkeypatch.setenv(name, value)
    # One checkpoint for the three (their lease keeps a second copy from running), on a
    # volume: a Spark Connect client (standard, serverless) reaches no object-store URI.
    assert checkpoints == {"${var.checkpoint_root}"}
    monkeypatch.syspath_prepend(str(ROOT))
    assert collect_config_errors(BUNDLE / "conf" / "orders.toml") == []


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
    r"deltalake|delta-rs|LOCKING_PROVIDER|ALLOW_UNSAFE_RENAME|noida|"
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


# The job's step, and the steps that run `retrylib status` and `redrive` (a dry run until
# the flag is taken out) on the same config: submit.sh's arguments before the config URI.
STEPS = {"step.json": [], "status-step.json": ["status"], "redrive-step.json": ["redrive"]}


@pytest.mark.parametrize("file", sorted(STEPS))
def test_step_is_what_aws_emr_add_steps_reads_from_a_file(file):
    (step,) = json.loads((EMR / file).read_text())
    assert set(step) <= STEP_KEYS
    assert step["Type"] == "CUSTOM_JAR"
    assert 0 < len(step["Name"]) <= 256
    assert step["ActionOnFailure"] in ACTIONS_ON_FAILURE
    # A long-running stream must not take the cluster down, or cancel later steps, when it
    # fails for good: submit.sh already restarted it.
    assert step["ActionOnFailure"] == "CONTINUE"
    assert step["Jar"] == "command-runner.jar"
    bash, script, *command, config = step["Args"][: 3 + len(STEPS[file])]
    assert bash == "bash"
    assert command == STEPS[file]
    # bootstrap.sh unpacks the repository into /home/hadoop/retrylib on the primary node.
    assert script == "/home/hadoop/retrylib/deploy/emr/submit.sh"
    assert (ROOT / script.removeprefix("/home/hadoop/retrylib/")).is_file()
    assert config == "s3://my-bucket/retrylib/conf/orders.toml"
    if file == "redrive-step.json":
        assert step["Args"][4:] == ["--dry-run"]
    # What `aws emr add-steps --steps file://...` sends, as EMR's API model takes it.
    release = json.loads((EMR / "cluster.json").read_text())["ReleaseLabel"]
    steps = build_step_config_list([step], "us-east-1", release)
    assert (
        _emr_request_problems("AddJobFlowSteps", {"JobFlowId": "j-0123ABC", "Steps": steps}) == ""
    )


def _emr_request_problems(operation: str, request: dict) -> str:
    """botocore's report of what is wrong with `request` for EMR's `operation` ("" when
    nothing), checked against the service model it ships; no call is made."""
    client = botocore.session.get_session().create_client("emr", region_name="us-east-1")
    shape = client.meta.service_model.operation_model(operation).input_shape
    return ParamValidator().validate(request, shape).generate_report()


def test_the_emr_request_check_finds_a_misspelt_key():
    cluster = json.loads((EMR / "cluster.json").read_text())
    cluster["StepConcurrency"] = cluster.pop("StepConcurrencyLevel")
    assert 'Unknown parameter in input: "StepConcurrency"' in _emr_request_problems(
        "RunJobFlow", cluster
    )


def test_the_cluster_runs_steps_side_by_side_with_delta_and_the_dynamodb_log_store():
    """cluster.json is a RunJobFlow request: a step concurrency above 1, so the status and
    redrive steps run beside the job's; EMR's own Delta (delta-defaults), and Delta's
    multi-cluster S3 log store, so those steps and the job may write one table; the
    bootstrap action the README copies to S3."""
    cluster = json.loads((EMR / "cluster.json").read_text())
    assert _emr_request_problems("RunJobFlow", cluster) == ""
    assert cluster["ReleaseLabel"] == "emr-spark-8.0.0"
    assert cluster["StepConcurrencyLevel"] > 1
    assert cluster["Applications"] == [{"Name": "Spark"}]
    settings = {c["Classification"]: c["Properties"] for c in cluster["Configurations"]}
    assert settings["delta-defaults"] == {"delta.enabled": "true"}
    spark = settings["spark-defaults"]
    log_store = "io.delta.storage.S3DynamoDBLogStore"
    for scheme in ("s3", "s3a"):
        assert spark[f"spark.delta.logStore.{scheme}.impl"] == log_store
    table = spark[f"spark.{log_store}.ddb.tableName"]
    region = spark[f"spark.{log_store}.ddb.region"]
    readme = (DEPLOY / "README.md").read_text()
    assert f"aws dynamodb create-table --region {region} --table-name {table}" in readme
    (action,) = cluster["BootstrapActions"]
    script = action["ScriptBootstrapAction"]
    uploaded = dict(re.findall(r"aws s3 cp (deploy/emr/bootstrap\.sh) (\S+)", readme))
    assert script["Path"] == uploaded["deploy/emr/bootstrap.sh"].rstrip("/") + "/bootstrap.sh"
    assert script["Args"][0] == script["Path"].rsplit("/", 1)[0]
    assert "deploy/emr/cluster.json" in readme


def test_the_readme_builds_every_wheel_it_copies_to_s3():
    emr = (DEPLOY / "README.md").read_text().split("## EMR", 1)[1]
    built = {
        (ROOT / (project or ".")).resolve() / "dist"
        for project in re.findall(r"python -m build --wheel ?(\S*)", emr)
    }
    copied = re.findall(r"aws s3 cp (\S+\.whl) ", emr)
    assert copied
    for wheel in copied:
        assert (ROOT / wheel).parent.resolve() in built, wheel


def test_the_emr_config_keeps_the_state_on_s3_and_is_valid_once_edited(monkeypatch, tmp_path):
    """On EMR a plain path is an HDFS path (`fs.defaultFS`), lost with the cluster, so the
    shipped config puts the checkpoint and every table on S3, under placeholders the user
    edits: every problem of the file as shipped is one, and the same file edited is valid.
    A URI is not looked at when the config loads: this reads the file, and imports the
    handler from the repository."""
    shipped = (EMR / "orders.toml").read_text()
    config = tomllib.loads(shipped)
    locations = [
        config["job"]["checkpoint"],
        *(config[section]["table"] for section in ("output", "dead_letter", "metrics")),
    ]
    assert all(location.startswith("s3://YOUR-BUCKET/") for location in locations), locations
    assert all(
        server.startswith("YOUR-BROKER-")
        for server in config["kafka"]["bootstrap_servers"].split(",")
    )
    monkeypatch.syspath_prepend(str(ROOT))
    problems = collect_config_errors(EMR / "orders.toml")
    assert [problem.split(": ")[0] for problem in problems] == [
        "job.checkpoint", "kafka.bootstrap_servers", "output.table", "dead_letter.table",
        "metrics.table",
    ]  # fmt: skip
    assert all("still holds the placeholder YOUR-" in problem for problem in problems)
    edited = tmp_path / "orders.toml"
    edited.write_text(shipped.replace("YOUR-BUCKET", "my-bucket").replace("YOUR-BROKER-", "b"))
    assert collect_config_errors(edited) == []


def test_the_emr_step_runs_the_config_the_readme_uploads():
    (step,) = json.loads((EMR / "step.json").read_text())
    uploaded = re.findall(r"aws s3 cp (\S+\.toml) (\S+)", (DEPLOY / "README.md").read_text())
    assert uploaded == [("deploy/emr/orders.toml", step["Args"][2])]
