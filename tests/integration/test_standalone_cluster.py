"""Exactly-once on a real Spark standalone cluster that loses a worker in the middle of a batch.

A master and two workers (1 core, 1 GiB each) run as JVMs of their own from the project's
Spark, on free loopback ports. The job runs as a user runs it, `./spark-submit.sh CONF`
with `--master spark://...` (client mode, `spark.task.maxFailures` at its cluster default
of 4), on the fault harness's handler (tests/faults/fault_handlers.py: successes,
transient failures, failures that always fail, non-retryable ones) with two short retry
tiers. Once the first batch is logged, the worker whose executor starts the next task
(the executors' own logs tell) is SIGKILLed with that executor: its whole process group.
A second wave of input follows, and the job drains on the surviving worker until the
tables hold every input and stay so; then it gets SIGINT and must exit 0.

Checked: Spark's event log shows that very task lost with the executor
(`ExecutorLostFailure`) in a batch after the first, and run again successfully on the
other executor, and the job logged that batch afterwards; and the fault harness's checks
(`FaultsJob.check`): every input once in the output or the dead-letter table, dead letters
once in the dead-letter topic (read_committed), no (record id, attempt) twice in the
retry tiers.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pyspark
import pytest
from helpers import JVM_OPTIONS, logged_metrics

from retrylib.dev.broker import free_port

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "faults"))

from harness import FaultsJob, logged_batches  # noqa: E402

pytestmark = pytest.mark.slow

SEED = 20261125
FIRST_WAVE = 1200
SECOND_WAVE = 600
PER_TRIGGER = 600  # main-topic records per batch: the first wave takes two
SETTLE = 6.0  # seconds without a change: longer than the longest retry delay (2s)
TIMEOUT = 400.0  # from the start to the drain: a guard against hangs on a busy machine


_TASK_LINE = re.compile(r"Executor: (Running|Finished) task \S+ in stage \S+ \(TID (\d+)\)")


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return None


def _alive(pid: int) -> bool:
    """`pid` runs (a zombie, dead but not yet reaped, does not count)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _group_members(pgid: int) -> list[int]:
    """The live processes of process group `pgid`."""
    members = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and _pgid(int(entry.name)) == pgid and _alive(int(entry.name)):
            members.append(int(entry.name))
    return members


def _cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (FileNotFoundError, ProcessLookupError):
        return []
    return raw.decode(errors="replace").split("\0")


def _kill_group(process: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait(30)


def _tail(path: Path, lines: int = 40) -> str:
    text = path.read_text(errors="replace").splitlines() if path.exists() else []
    return f"--- {path.name} (last {lines} lines) ---\n" + "\n".join(text[-lines:])


@dataclass
class Worker:
    """A standalone worker JVM, leader of a process group of its own: the executor it
    launches (`CoarseGrainedExecutorBackend`, a child) and that executor's Python workers
    are in the group, so one `os.killpg` takes them all."""

    process: subprocess.Popen
    log: Path
    work_dir: Path

    @property
    def pid(self) -> int:
        return self.process.pid

    def executors(self) -> dict[str, int]:
        """The executor JVMs this worker runs now: executor id -> pid."""
        found = {}
        for pid in _group_members(self.pid):
            command = _cmdline(pid)
            if any(part.endswith("CoarseGrainedExecutorBackend") for part in command):
                found[command[command.index("--executor-id") + 1]] = pid
        return found

    def started_tasks(self) -> set[str]:
        """The task ids (TIDs) this worker's executors have started and not finished, as
        their own logs (stderr in the work dir, INFO) say it the moment it happens."""
        started, finished = set(), set()
        for log in self.work_dir.glob("*/*/stderr"):
            for state, tid in _TASK_LINE.findall(log.read_text(errors="replace")):
                (started if state == "Running" else finished).add(tid)
        return started - finished

    def kill(self) -> list[int]:
        """SIGKILL the worker's process group and wait until none of it runs; returns the
        pids it had."""
        members = _group_members(self.pid)
        _kill_group(self.process)
        deadline = time.monotonic() + 30
        while any(_alive(pid) for pid in members):  # a JVM takes a moment to go
            assert time.monotonic() < deadline, f"still running after SIGKILL: {members}"
            time.sleep(0.05)
        return members


@dataclass
class StandaloneCluster:
    url: str
    web_url: str
    master: subprocess.Popen
    master_log: Path
    workers: list[Worker]

    def state(self) -> dict:
        with urllib.request.urlopen(f"{self.web_url}/json/", timeout=5) as response:
            return json.load(response)

    def logs(self) -> str:
        return "\n".join(_tail(path) for path in [self.master_log, *(w.log for w in self.workers)])


def _spark_env(**extra: str) -> dict[str, str]:
    """The environment of the cluster's JVMs: this project's Spark (the pyspark package is
    a Spark home), everything on loopback, small daemons."""
    return {
        **os.environ,
        "SPARK_HOME": str(Path(pyspark.__file__).parent),
        "PYSPARK_PYTHON": sys.executable,
        "SPARK_LOCAL_IP": "127.0.0.1",
        "SPARK_DAEMON_MEMORY": "256m",
        "SPARK_DAEMON_JAVA_OPTS": JVM_OPTIONS,
        **extra,
    }


@pytest.fixture(scope="module")
def standalone_cluster(tmp_path_factory) -> Iterator[StandaloneCluster]:
    """A master and two workers (1 core, 1 GiB each), stopped with everything they started."""
    base = tmp_path_factory.mktemp("standalone")
    spark_class = str(Path(sys.executable).parent / "spark-class")
    port, web_port = free_port(), free_port()
    processes: list[subprocess.Popen] = []

    def start(args: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen:
        with log.open("wb") as out:
            process = subprocess.Popen(
                [spark_class, *args],
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=base,
                env=env,
                start_new_session=True,  # spark-class execs the JVM: it leads its group
            )
        processes.append(process)
        return process

    try:
        master_log = base / "master.log"
        master = start(
            [
                "org.apache.spark.deploy.master.Master",
                *("--host", "127.0.0.1", "--port", str(port), "--webui-port", str(web_port)),
            ],
            master_log,
            # No REST submission server: it would take the fixed port 6066.
            _spark_env(SPARK_MASTER_OPTS="-Dspark.master.rest.enabled=false"),
        )
        workers = []
        for index in range(2):
            work_dir = base / f"worker-{index}"
            work_dir.mkdir()
            log = base / f"worker-{index}.log"
            process = start(
                [
                    "org.apache.spark.deploy.worker.Worker",
                    *("--host", "127.0.0.1", "--port", "0", "--webui-port", "0"),
                    *("--cores", "1", "--memory", "1g", "--work-dir", str(work_dir)),
                    f"spark://127.0.0.1:{port}",
                ],
                log,
                _spark_env(),
            )
            workers.append(Worker(process, log, work_dir))
        cluster = StandaloneCluster(
            f"spark://127.0.0.1:{port}", f"http://127.0.0.1:{web_port}", master, master_log, workers
        )
        deadline = time.monotonic() + 120
        while True:
            dead = [p.args[1] for p in processes if p.poll() is not None]
            assert not dead, f"{dead} exited at start\n{cluster.logs()}"
            with contextlib.suppress(OSError, ValueError):
                if cluster.state().get("aliveworkers") == 2:
                    break
            assert time.monotonic() < deadline, f"no cluster in 120s\n{cluster.logs()}"
            time.sleep(0.5)
        yield cluster
    finally:
        groups = [p.pid for p in processes]
        for process in processes:
            _kill_group(process)
        # The executors are the workers' children, in their groups: none may outlive them.
        deadline = time.monotonic() + 10
        while (left := [pid for g in groups for pid in _group_members(g)]) and (
            time.monotonic() < deadline
        ):
            time.sleep(0.2)
        assert not left, f"processes of the cluster left running: {left}"


def _task_events(events_dir: Path) -> tuple[dict[str, str], list[dict]]:
    """From the job's Spark event log: the batch id of each stage ("streaming.sql.batchId"
    of the job it ran in), and every task's end event."""
    batch_of_stage: dict[str, str] = {}
    ends = []
    for path in events_dir.iterdir():
        for event in map(json.loads, path.read_text().splitlines()):
            if event["Event"] == "SparkListenerJobStart":
                batch = (event.get("Properties") or {}).get("streaming.sql.batchId")
                for stage in event["Stage IDs"]:
                    batch_of_stage[str(stage)] = batch
            elif event["Event"] == "SparkListenerTaskEnd":
                ends.append(event)
    return batch_of_stage, ends


def test_exactly_once_when_a_worker_dies_mid_batch(
    standalone_cluster, bootstrap_servers, make_topic, spark, tmp_path
):
    started = time.monotonic()
    rng = random.Random(SEED)
    topic = make_topic("orders", partitions=2)
    job = FaultsJob(bootstrap_servers, topic, tmp_path, name="cluster", partitions=2)
    config = job.write_config(kafka={"max_offsets_per_trigger": PER_TRIGGER})
    job.produce_wave(rng, FIRST_WAVE)

    # What a user of a small cluster writes in a properties file: the JVMs' options.
    # The event log says which task each executor lost and which batch it was part of.
    events = tmp_path / "spark-events"
    events.mkdir()
    properties = tmp_path / "spark.properties"
    properties.write_text(
        f"spark.driver.extraJavaOptions={JVM_OPTIONS}\n"
        f"spark.executor.extraJavaOptions={JVM_OPTIONS}\n"
        "spark.ui.enabled=false\n"
        "spark.eventLog.enabled=true\n"
        f"spark.eventLog.dir=file://{events}\n"
        "spark.eventLog.compress=false\n"
        "spark.eventLog.rolling.enabled=false\n"
    )
    submit_options = [
        *("--master", standalone_cluster.url, "--total-executor-cores", "2"),
        *("--executor-memory", "1g", "--properties-file", str(properties)),
    ]
    env = {
        **_spark_env(),
        "PYSPARK_DRIVER_PYTHON": sys.executable,
        "RETRYLIB_LOG_LEVEL": "INFO",
        "RETRYLIB_SPARK_EXTRA": " ".join(submit_options),
    }
    log = tmp_path / "job.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [str(REPO / "spark-submit.sh"), str(config)],
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=REPO,
            env=env,
            start_new_session=True,  # the group: spark-submit's JVM and the Python driver
        )

    def text() -> str:
        return log.read_text(errors="replace")

    def explain(message: str) -> str:
        return f"{message}\n{_tail(log, 80)}\n{standalone_cluster.logs()}"

    workers = standalone_cluster.workers
    try:
        deadline = started + TIMEOUT
        # Batch 0 is done, its metrics too: they read the dead-letter table, a Spark job of
        # batch 0 that runs after its batch line.
        while not logged_metrics(text()):
            assert process.poll() is None, explain("the job exited")
            assert time.monotonic() < deadline, explain("no batch in time")
            time.sleep(0.2)
        batches_before = len(logged_batches(text()))
        # Then the first task an executor starts: it belongs to a later batch, which it
        # is in the middle of. The executors' own logs say so at once (the driver's UI,
        # fed by its listener bus, can lag by seconds on a busy machine).
        old_tasks = [w.started_tasks() for w in workers]
        victim, task = None, None
        while victim is None:
            for worker, old in zip(workers, old_tasks, strict=True):
                new = worker.started_tasks() - old
                if new:
                    victim, task = worker, min(new, key=int)
                    break
            else:
                assert process.poll() is None, explain("the job exited")
                assert time.monotonic() < deadline, explain("no task started in time")
                time.sleep(0.05)
        [(executor_id, executor_pid)] = victim.executors().items()
        killed_pids = victim.kill()
        killed_at = time.monotonic()
        batches_at_kill = len(logged_batches(text()))
        assert executor_pid in killed_pids and not _alive(executor_pid)
        print(
            f"\nkilled worker {victim.pid} and its executor {executor_id} (pid {executor_pid}) "
            f"running task {task}, at {killed_at - started:.1f}s, {batches_at_kill} batches "
            f"logged ({batches_before} when the wait for a task began)",
            flush=True,
        )
        job.produce_wave(rng, SECOND_WAVE)

        note = job.wait_settled(
            process, log, timeout=max(deadline - time.monotonic(), 1.0), settle=SETTLE
        )
        assert process.poll() is None, explain("the job exited before it settled")
        process.send_signal(signal.SIGINT)  # to spark-submit's JVM: stop after the batch
        try:
            returncode = process.wait(150)
        except subprocess.TimeoutExpired:
            returncode = None
        print(f"{note}; stopped rc={returncode} at {time.monotonic() - started:.1f}s", flush=True)
        assert note.startswith("settled"), explain(f"the job did not settle: {note}")
        assert returncode == 0, explain(f"the job's exit code after SIGINT: {returncode}")
    finally:
        if process.poll() is None or _group_members(process.pid):
            _kill_group(process)

    output = text()
    assert f"Lost executor {executor_id} " in output, explain("no lost executor logged")
    # The task the killed executor was running failed with it, in a batch after the first,
    # and ran again, successfully, on the surviving worker's executor; that batch then
    # completed.
    batch_of_stage, ends = _task_events(events)
    [lost] = [e for e in ends if str(e["Task Info"]["Task ID"]) == task]
    assert lost["Task End Reason"]["Reason"] == "ExecutorLostFailure", lost["Task End Reason"]
    assert lost["Task Info"]["Executor ID"] == executor_id
    stage, index = str(lost["Stage ID"]), lost["Task Info"]["Index"]
    rerun = [
        e
        for e in ends
        if str(e["Stage ID"]) == stage
        and e["Task Info"]["Index"] == index
        and e["Task End Reason"]["Reason"] == "Success"
    ]
    assert rerun and all(e["Task Info"]["Executor ID"] != executor_id for e in rerun), rerun
    batch = batch_of_stage.get(stage)
    assert batch is not None and int(batch) >= 1, f"stage {stage} of batch {batch}"
    after_kill = logged_batches(output)[batches_at_kill:]
    assert int(batch) in [b["batch_id"] for b in after_kill], explain(f"batch {batch} not done")
    job.check(spark)
    print(
        f"{len(job.inputs)} inputs, {len(logged_batches(output))} batches; task {task} of "
        f"stage {stage} in batch {batch} lost and run again; {time.monotonic() - started:.1f}s",
        flush=True,
    )
