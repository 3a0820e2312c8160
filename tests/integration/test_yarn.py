"""The job on YARN, submitted as EMR submits it (deploy/emr/submit.sh): `--master yarn` through
spark-submit.sh with RETRYLIB_SPARK_EXTRA, HADOOP_CONF_DIR and YARN_CONF_DIR naming the
cluster's config, its state on HDFS named by plain paths (HDFS is the default file system).

One YARN cluster for the module (`tests/yarn_cluster.py`: Hadoop's MiniYARNCluster, one
NodeManager), on the run's HDFS (the `hdfs` fixture). Its containers are processes of this
machine, so the broker on loopback is theirs too. Effects are checked as the fault harness
checks them (`FaultsJob`, tests/faults/harness.py).

- Client mode (EMR's default): the driver runs in spark-submit's process, YARN runs the
  executors; SIGINT stops it after its batch.
- Cluster mode with `spark.yarn.maxAppAttempts=2`: the driver runs in the application
  master's container. That container is SIGKILLed whole (its JVM and the Python driver, as a
  lost node ends it) in the middle of a batch's effects (an executor has produced one of its
  units); YARN starts a second attempt, which replays that batch from its manifest on HDFS
  and finishes exactly once.
  SIGTERM to its JVM (what YARN sends a container it stops) stops it after its batch, and
  the application ends SUCCEEDED.
"""

from __future__ import annotations

import contextlib
import os
import random
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pyspark
import pytest
from helpers import JVM_OPTIONS, REPO, job_env, wait_for
from yarn_cluster import YarnCluster

sys.path.insert(0, str(REPO / "tests" / "faults"))

from harness import FaultsJob, logged_batches

pytestmark = pytest.mark.slow

SEED = 20261207
FIRST_WAVE = 600
SECOND_WAVE = 300
PER_TRIGGER = 300  # main-topic records per batch: the first wave takes two
SETTLE = 6.0  # seconds without a change: longer than the longest retry delay (2s)
TIMEOUT = 400.0  # from the submission to the drain: a guard against hangs on a busy machine
_APPLICATION = re.compile(r"application_\d+_\d+")
_UNIT_PRODUCED = re.compile(
    r"produced \d+ record\(s\) of batch (\d+) unit (\d+) in one transaction"
)


@pytest.fixture(scope="module")
def yarn(hdfs, tmp_path_factory) -> Iterator[YarnCluster]:
    cluster = YarnCluster(tmp_path_factory.mktemp("yarn"), hdfs.uri).start()
    try:
        yield cluster
    finally:
        cluster.stop()


def _faults_job(hdfs, bootstrap_servers: str, make_topic, workdir: Path, name: str) -> FaultsJob:
    """A `FaultsJob` whose checkpoint and tables are on HDFS, named by plain paths."""
    state = str(workdir / "state")
    job = FaultsJob(
        bootstrap_servers,
        make_topic("orders", partitions=2),
        workdir,
        name=name,
        state=state,
        state_here=f"{hdfs.uri}{state}",
    )
    job.write_config(kafka={"max_offsets_per_trigger": PER_TRIGGER})
    return job


def _submit(yarn: YarnCluster, job: FaultsJob, mode: str, attempts: int) -> subprocess.Popen:
    """Start `spark-submit.sh CONFIG` on YARN in deploy `mode`, its output in
    workdir/submit.log, in a process group of its own.

    In cluster mode the config goes with the application (`--files`, as spark-submit ships
    it to the driver's container) and the job is given its name there. Spark's own jars are
    on every node already (`local:`), as a cluster's Spark is: uploading them would cost each
    submission 300 MB."""
    config = job.workdir / "job.toml"
    properties = job.workdir / "spark.properties"
    properties.write_text(
        f"spark.driver.extraJavaOptions={JVM_OPTIONS}\n"
        f"spark.executor.extraJavaOptions={JVM_OPTIONS}\n"
        f"spark.yarn.am.extraJavaOptions={JVM_OPTIONS}\n"
        f"spark.yarn.jars=local:{Path(pyspark.__file__).parent / 'jars'}/*\n"
        f"spark.pyspark.python={sys.executable}\n"
        f"spark.pyspark.driver.python={sys.executable}\n"
        "spark.yarn.appMasterEnv.RETRYLIB_LOG_LEVEL=INFO\n"
        # Every JVM of the job on loopback (the host name alone would resolve to another).
        "spark.yarn.appMasterEnv.SPARK_LOCAL_IP=127.0.0.1\n"
        "spark.executorEnv.SPARK_LOCAL_IP=127.0.0.1\n"
        f"spark.yarn.maxAppAttempts={attempts}\n"
        "spark.ui.enabled=false\n"
    )
    submit_options = [
        *("--master", "yarn", "--deploy-mode", mode, "--properties-file", str(properties)),
        *("--num-executors", "1", "--executor-cores", "2", "--executor-memory", "1g"),
        *("--driver-memory", "1g"),
    ]
    if mode == "cluster":
        submit_options += ["--files", str(config)]
    env = job_env(
        {
            "HADOOP_CONF_DIR": str(yarn.conf_dir),
            "YARN_CONF_DIR": str(yarn.conf_dir),
            "RETRYLIB_LOG_LEVEL": "INFO",
            "SPARK_LOCAL_IP": "127.0.0.1",
            "RETRYLIB_SPARK_EXTRA": " ".join(submit_options),
        }
    )
    with (job.workdir / "submit.log").open("ab") as out:
        return subprocess.Popen(
            [str(REPO / "spark-submit.sh"), config.name if mode == "cluster" else str(config)],
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=REPO,
            env=env,
            start_new_session=True,
        )


def _kill_group(process: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait(30)


def _application_id(log: Path, process: subprocess.Popen) -> str:
    found: list[str] = []

    def submitted() -> bool:
        found[:] = _APPLICATION.findall(log.read_text(errors="replace"))[:1]
        return bool(found)

    wait_for(submitted, 120, "the application's submission", process)
    return found[0]


def _tail(path: Path, lines: int = 60) -> str:
    text = path.read_text(errors="replace").splitlines() if path.exists() else []
    return f"--- {path} (last {lines} lines) ---\n" + "\n".join(text[-lines:])


def test_exactly_once_on_yarn_in_client_mode(
    yarn, hdfs, bootstrap_servers, make_topic, spark, tmp_path
):
    started = time.monotonic()
    job = _faults_job(hdfs, bootstrap_servers, make_topic, tmp_path, "yarn-client")
    job.produce_wave(random.Random(SEED), FIRST_WAVE)
    process = _submit(yarn, job, "client", attempts=1)
    log = tmp_path / "submit.log"
    try:
        app_id = _application_id(log, process)
        note = job.wait_settled(process, log, timeout=TIMEOUT, settle=SETTLE)
        assert process.poll() is None, _tail(log)
        process.send_signal(signal.SIGINT)  # to spark-submit's JVM: stop after the batch
        returncode = process.wait(150)
    finally:
        _kill_group(process)
    assert note.startswith("settled"), f"{note}\n{_tail(log)}"
    assert returncode == 0, _tail(log)
    report = yarn.application(app_id)
    assert (report["state"], report["finalStatus"]) == ("FINISHED", "SUCCEEDED"), report
    assert not Path(job.state).exists()  # on HDFS, not the local disk
    job.check(spark)
    batches = logged_batches(log.read_text(errors="replace"))
    print(
        f"\n{app_id}: {len(job.inputs)} inputs, {len(batches)} batches, "
        f"{time.monotonic() - started:.1f}s",
        flush=True,
    )


def test_a_second_attempt_finishes_exactly_once_after_the_driver_container_dies_mid_batch(
    yarn, hdfs, bootstrap_servers, make_topic, spark, tmp_path
):
    started = time.monotonic()
    rng = random.Random(SEED + 1)
    job = _faults_job(hdfs, bootstrap_servers, make_topic, tmp_path, "yarn-cluster")
    job.produce_wave(rng, FIRST_WAVE)
    process = _submit(yarn, job, "cluster", attempts=2)
    log = tmp_path / "submit.log"

    def attempt_log(attempt: int) -> Path:
        """The driver's log in the application master's container of `attempt` (the Python
        driver logs to its stdout, Spark's JVM to its stderr)."""
        logs = yarn.container_logs(app_id)
        return next(logs.glob(f"container_*_{attempt:02d}_000001"), logs / "none") / "stdout"

    def executors_log(attempt: int) -> str:
        """What the executors of `attempt` logged (INFO, with retrylib's lines)."""
        logs = yarn.container_logs(app_id).glob(f"container_*_{attempt:02d}_*/stderr")
        return "".join(
            path.read_text(errors="replace")
            for path in logs
            if not path.parent.name.endswith("_000001")
        )

    def explain(message: str) -> str:
        return "\n".join(
            [
                message,
                _tail(log, 20),
                *(_tail(attempt_log(n)) for n in (1, 2)),
                _tail(yarn.log_path),
            ]
        )

    try:
        app_id = _application_id(log, process)
        deadline = started + TIMEOUT
        # The first attempt is in the middle of a batch's effects: its decisions are staged
        # (the manifest claimed), an executor has committed a produce unit's transaction,
        # and the batch is not done (its other units, its Delta appends).
        producing: list[int] = []

        def producing_later_batch() -> bool:
            found = _UNIT_PRODUCED.findall(executors_log(1))
            producing[:] = [int(b) for b, _ in found if int(b) > 0][:1]
            return bool(producing)

        wait_for(
            producing_later_batch,
            deadline - time.monotonic(),
            "a produce unit of a batch after the first",
            process,
        )
        [driver_container] = [c for c in yarn.container_processes() if c.endswith("_01_000001")]
        killed = yarn.kill_container(driver_container)
        [batch] = producing
        done_at_kill = [b["batch_id"] for b in logged_batches(attempt_log(1).read_text())]
        print(
            f"\nkilled {driver_container} ({len(killed)} processes) at "
            f"{time.monotonic() - started:.1f}s, batch {batch} producing; batches logged: "
            f"{done_at_kill}",
            flush=True,
        )
        job.produce_wave(rng, SECOND_WAVE)

        wait_for(
            lambda: attempt_log(2).exists(),
            deadline - time.monotonic(),
            "the second attempt",
            process,
        )
        note = job.wait_settled(
            process, attempt_log(2), timeout=max(deadline - time.monotonic(), 1.0), settle=SETTLE
        )
        assert note.startswith("settled"), explain(f"the second attempt did not settle: {note}")
        # What YARN sends a container it stops: the driver's JVM stops the query after its
        # batch, the application master unregisters, and spark-submit sees it end.
        [second] = [c for c in yarn.container_processes() if c.endswith("_02_000001")]
        os.kill(yarn.container_jvm(second), signal.SIGTERM)
        returncode = process.wait(150)
    finally:
        _kill_group(process)
    assert returncode == 0, explain(f"spark-submit's exit code: {returncode}")
    report = yarn.application(app_id)
    assert (report["state"], report["finalStatus"]) == ("FINISHED", "SUCCEEDED"), report
    assert len(yarn.attempts(app_id)) == 2, yarn.attempts(app_id)
    first = logged_batches(attempt_log(1).read_text(errors="replace"))
    second = logged_batches(attempt_log(2).read_text(errors="replace"))
    assert first and second, explain("each attempt ran batches")
    # The batch the kill cut off was replayed by the second attempt from its manifest (unless
    # the first had finished it: then Spark may have committed it too).
    if batch not in done_at_kill:
        replayed = {b["batch_id"]: b.get("replayed") for b in second}
        assert replayed.get(batch) is True, explain(f"batch {batch} not replayed: {replayed}")
        # The units the first attempt committed were not produced again.
        committed = {u for b, u in _UNIT_PRODUCED.findall(executors_log(1)) if int(b) == batch}
        skipped = set(
            re.findall(
                rf"records of batch {batch} unit (\d+) were produced before; skipped",
                executors_log(2),
            )
        )
        assert committed <= skipped, explain(f"units {committed} produced, {skipped} skipped")
    assert "stopped after batch" in attempt_log(2).read_text(errors="replace"), explain("stop")
    job.check(spark)
    print(
        f"{len(job.inputs)} inputs; attempt 1: batches {[b['batch_id'] for b in first]}; "
        f"attempt 2: {[(b['batch_id'], b.get('replayed')) for b in second]} (id, replayed); "
        f"{time.monotonic() - started:.1f}s",
        flush=True,
    )
