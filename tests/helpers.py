"""Shared by the tests (and the bench's job configs): job configs written as TOML, records
produced, a job run until it settles, Delta tables read back through Spark's Delta reader as
users read them, topics read back from Kafka, and an executor task driven with Arrow batches
directly."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from confluent_kafka import Message
from pyspark.sql import DataFrame, SparkSession

from retrylib.batch.result import BatchResult
from retrylib.config.loader import collect_config_errors, load_config
from retrylib.config.model import Config
from retrylib.errors import ConfigError
from retrylib.job import start_query, stop_gracefully
from retrylib.kafka.arrow_records import KAFKA_ARROW_SCHEMA
from retrylib.kafka.clients import make_consumer, make_producer, topic_partitions
from retrylib.kafka.offsets import EARLIEST, LATEST, Offsets
from retrylib.kafka.reading import READ_TO_END_OPTIONS, ReadToEnd
from retrylib.ops.cli import main
from retrylib.source.kafka_source import KafkaStreamReader
from retrylib.source.options import parse_source_options
from retrylib.task.plan import TaskPlan
from retrylib.task.results import KINDS, result_schema
from retrylib.task.routing import run_task

REPO = Path(__file__).resolve().parents[1]

JVM_OPTIONS = "-XX:+UseSerialGC -XX:TieredStopAtLevel=1 -XX:ReservedCodeCacheSize=240m"
"""The Java options of the Spark JVMs the tests start (`tests/conftest.py` sets them for all).

A test's JVM lives for a minute or less on two cores: the client compiler alone and one GC
thread leave the cores to the job instead of to the optimizing compiler's threads. With the
client compiler alone the JVM reserves 48 MB for compiled code (240 MB with both): a Spark
Connect server filled that in 41 s, ran on interpreted from then on, and once failed a task
with "Out of space in CodeCache" and stopped. So every test JVM reserves the tiered default,
which the longer-lived ones (the tests' session, a Connect server) need."""


def job_toml(
    workdir: str | Path,
    topics: Sequence[str] = ("orders",),
    *,
    name: str = "job",
    bootstrap_servers: str = "127.0.0.1:9092",
    **sections: Mapping[str, Any],
) -> str:
    """A job config's TOML text: job `name` reading `topics` from `bootstrap_servers`,
    calling the handler `h:handle` from `workdir` with `id STRING` rows, writing them to
    workdir/out, checkpointing in workdir/checkpoint.

    Each keyword in `sections` names a table (`job`, `kafka`, `handler`, `output`, `retry`,
    `dead_letter`, `metrics`, ...) and updates it key by key: a value of None drops the key,
    a mapping is a sub-table (`kafka={"options": {"linger.ms": "5"}}` is [kafka.options]).
    """
    tables: dict[str, dict[str, Any]] = {
        "job": {"name": name, "checkpoint": f"{workdir}/checkpoint"},
        "kafka": {"bootstrap_servers": bootstrap_servers, "topics": list(topics)},
        "handler": {"function": "h:handle", "output_schema": "id STRING", "paths": [workdir]},
        "output": {"table": f"{workdir}/out"},
    }
    for section, changes in sections.items():
        table = tables.setdefault(section, {})
        for key, value in changes.items():
            if value is None:
                table.pop(key, None)
            else:
                table[key] = value
    return "".join(_toml_table(section, keys) for section, keys in tables.items())


def write_job_toml(path: Path, workdir: str | Path | None = None, **kwargs: Any) -> Path:
    """Write `job_toml(workdir, **kwargs)` to `path` (workdir: the file's folder by default)
    and return the path."""
    path.write_text(job_toml(path.parent if workdir is None else workdir, **kwargs))
    return path


def write_noop_job(workdir: Path, **kwargs: Any) -> Path:
    """Write workdir/job.toml, `job_toml(workdir, **kwargs)`, and the do-nothing handler it
    names by default (`h:handle`, in workdir/h.py); return the config's path. Loading it
    contacts no broker."""
    (workdir / "h.py").write_text("def handle(record):\n    return None\n")
    return write_job_toml(workdir / "job.toml", **kwargs)


def _toml_table(name: str, keys: Mapping[str, Any]) -> str:
    plain = [f"{_toml_key(k)} = {_toml_value(v)}\n" for k, v in keys.items() if not _is_table(v)]
    nested = [_toml_table(f"{name}.{_toml_key(k)}", v) for k, v in keys.items() if _is_table(v)]
    return f"[{name}]\n" + "".join(plain) + "".join(nested)


def _is_table(value: Any) -> bool:
    return isinstance(value, Mapping)


def _toml_key(key: str) -> str:
    return key if re.fullmatch(r"[A-Za-z0-9_-]+", key) else json.dumps(key)


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    # A JSON string is a TOML basic string: the same quotes and escapes.
    return json.dumps(str(value))


# The smallest valid config, as section -> key -> TOML literal; "{tmp}" becomes tmp_path.
MINIMAL_CONFIG = {
    "job": {"name": '"orders"', "checkpoint": '"{tmp}/checkpoint"'},
    "kafka": {"bootstrap_servers": '"127.0.0.1:9092"', "topics": '["orders"]'},
    "handler": {
        "function": '"orders_handlers.handlers:enrich_order"',
        "output_schema": '"order_id STRING, total DOUBLE"',
    },
    "output": {"table": '"{tmp}/out"'},
}


def write_literal_config(
    tmp_path: Path, changes: dict[str, str | None] | None = None, extra: str = ""
) -> Path:
    """Write MINIMAL_CONFIG with `changes` ("section.key" -> TOML literal, None to delete the key;
    "section" -> None to drop a table) and raw `extra` TOML appended; return its path.
    The config-parsing tests write values as TOML literals, as a user might mistype them;
    `job_toml` writes every value well-formed.
    """
    sections = {name: dict(keys) for name, keys in MINIMAL_CONFIG.items()}
    for dotted, literal in (changes or {}).items():
        section, _, key = dotted.partition(".")
        if not key:
            sections.pop(section)
        elif literal is None:
            sections[section].pop(key)
        else:
            sections.setdefault(section, {})[key] = literal
    lines = [
        f"[{name}]\n" + "".join(f"{key} = {literal}\n" for key, literal in keys.items())
        for name, keys in sections.items()
    ]
    path = tmp_path / "job.toml"
    path.write_text(("\n".join(lines) + extra).replace("{tmp}", str(tmp_path)))
    return path


def problem_for(tmp_path: Path, changes: dict[str, str | None], extra: str = "") -> str:
    """The one problem the changed config has, after checking load_config raises it."""
    path = write_literal_config(tmp_path, changes, extra)
    problems = collect_config_errors(path)
    assert len(problems) == 1, problems
    with pytest.raises(ConfigError) as raised:
        load_config(path)
    assert raised.value.problems == tuple(problems)  # type: ignore[attr-defined]
    return problems[0]


def produce(
    bootstrap: str, topic: str, records: Iterable[tuple[str, str]], partitions: int | None = None
) -> int:
    """Produce (key, value) string pairs, spread over `partitions` round-robin if given;
    returns how many."""
    producer = make_producer(bootstrap, {})
    count = 0
    for i, (key, value) in enumerate(records):
        kwargs = {"partition": i % partitions} if partitions else {}
        producer.produce(topic, key=key.encode(), value=value.encode(), **kwargs)
        count += 1
    producer.flush(30)
    return count


def run_cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """`retrylib ARGS` in this process (its `main`, on the tests' Spark session): the exit
    code, stdout and stderr. The root logger is put back as it was."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        code = main(list(args))
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def run_cli_completed(
    capture: pytest.CaptureFixture[str], *args: str
) -> subprocess.CompletedProcess[str]:
    """`run_cli`'s outcome as the CompletedProcess that `run_retrylib`, its twin in a
    process of its own, returns: a test reads either the same way. With `capfd` as
    `capture` the output holds what the tests' session's JVM prints meanwhile."""
    return subprocess.CompletedProcess(["retrylib", *args], *run_cli(capture, *args))


def assert_one_error_line(code: int, err: str, start: str, *parts: str) -> None:
    """A failed `retrylib` run: exit 1, its last line "error: START..." holding each of
    `parts`, and no traceback or flood of lines before it."""
    assert code == 1, err[-3000:]
    last = err.strip().splitlines()[-1]
    assert last.startswith(f"error: {start}"), last
    for part in parts:
        assert part in last, last
    assert "Traceback" not in err and "\tat " not in err, err[-3000:]
    assert len(err.splitlines()) < 20, err[-3000:]


def port_answers(port: int) -> bool:
    """Whether a server listens on 127.0.0.1:`port` (a connection is accepted within 1 s)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


def kill_group(process: subprocess.Popen) -> None:
    """SIGKILL the process group `process` leads (a server the tests started in a session of
    its own, with every process it started); a group already gone is fine."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)


def start_server(
    command: Sequence[str],
    log_path: Path,
    ready: Callable[[], bool],
    what: str,
    *,
    cwd: Path,
    env: Mapping[str, str] | None = None,
    timeout: float = 120,
) -> subprocess.Popen:
    """Start a server the tests run (`command`, in `cwd`) as the leader of a process group
    of its own, its output appended to `log_path`, and wait until `ready()`. Raises
    `RuntimeError` naming `what`, with the log's tail, when it ends first or `timeout`
    seconds pass; the group is stopped then (`stop_group`)."""
    with open(log_path, "ab") as log:
        process = subprocess.Popen(
            command,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=cwd,
            env=None if env is None else dict(env),
            start_new_session=True,
        )
    deadline = time.monotonic() + timeout
    while not ready():
        if process.poll() is not None or time.monotonic() > deadline:
            stop_group(process)
            tail = log_path.read_text(errors="replace")[-3000:]
            raise RuntimeError(f"{what} did not start: see {log_path}\n{tail}")
        time.sleep(0.2)
    return process


def stop_group(process: subprocess.Popen | None) -> None:
    """Stop a server started in a process group of its own: SIGTERM, SIGKILL if it is still
    up 30 s later, then SIGKILL to whatever is left of its group."""
    if process is None:
        return
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    kill_group(process)


def retrylib_command(*args: str) -> list[str]:
    """The command line of `retrylib ARGS` as a user runs it, on this interpreter
    (`python -m retrylib`)."""
    return [sys.executable, "-m", "retrylib", *args]


def job_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a job process the tests start: this process's, with Spark's
    Python workers on this interpreter, and `extra` added."""
    return {
        **os.environ,
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
        **(extra or {}),
    }


def run_retrylib(
    *args: str,
    env: Mapping[str, str] | None = None,
    timeout: float = 600,
    new_session: bool = False,
) -> subprocess.CompletedProcess[str]:
    """`retrylib ARGS` in a process of its own (`retrylib_command`), with `env` added to the
    environment (`job_env`).

    With `new_session` it leads a process group of its own, so that a crash (`env` from
    `crash_env`, tests/faults/crash/) kills its Spark JVM and workers with it.
    """
    return subprocess.run(
        retrylib_command(*args),
        env=job_env(env),
        capture_output=True,
        text=True,
        timeout=timeout,
        start_new_session=new_session,
    )


@contextlib.contextmanager
def running_job(
    command: Sequence[str], env: Mapping[str, str], log_path: Path
) -> Iterator[subprocess.Popen]:
    """`command` running in the background, its output in `log_path` (a file, not a pipe: a
    full pipe would stall it, and opened for appending so that a crash listener's line
    appended through /proc is not written over); killed on the way out if it is still
    running."""
    with log_path.open("a") as log_file:
        job = subprocess.Popen(command, env=env, stdout=log_file, stderr=subprocess.STDOUT)
        try:
            yield job
        finally:
            if job.poll() is None:
                job.kill()


def logged_metrics(log: str) -> list[dict]:
    """The metrics of each batch a `retrylib run` logged, from its text lines
    (`retrylib.metrics: {...}`) or its JSON ones (`RETRYLIB_LOG_FORMAT=json`)."""
    rows = []
    for line in log.splitlines():
        if line.startswith("{") and '"logger": "retrylib.metrics"' in line:
            entry = json.loads(line)
            if "metrics" in entry:
                rows.append(entry["metrics"])
        elif "retrylib.metrics: " in line:
            rows.append(json.loads(line.split("retrylib.metrics: ", 1)[1]))
    return rows


def metrics_totals(log: str) -> dict[str, int]:
    """The counters of a `retrylib run`, summed over the metrics its batches logged."""
    totals: dict[str, int] = {}
    for row in logged_metrics(log):
        for name, value in row.items():
            if isinstance(value, int) and not isinstance(value, bool):
                totals[name] = totals.get(name, 0) + value
    return totals


def wait_for(
    done: Callable[[], bool],
    timeout: float,
    what: str = "the condition",
    job: subprocess.Popen | None = None,
) -> None:
    """Wait until `done()`, failing, with `what` it waited for, if `timeout` seconds pass
    first or if `job` (a process) exits."""
    deadline = time.monotonic() + timeout
    while not done():
        assert job is None or job.poll() is None, f"the job exited waiting for {what}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def wait_for_rows(
    job: subprocess.Popen,
    log_path: Path,
    table: str,
    enough: Callable[[int], bool],
    timeout: float,
) -> int:
    """Wait until `enough(rows)` holds for the rows of the Delta table `table`, which `job`
    writes while logging to `log_path`; fails if the job exits or `timeout` seconds pass
    first. Returns the rows.

    The table is read again only once the job's log has grown (a job logs each batch it
    finishes, on a Spark Connect client too): a read costs the tests' session about 0.4
    CPU-s, so reading it every 0.2 s would take a core of a small machine from the job."""
    read = {"at": -1, "rows": 0}  # the log's size when the table was last read, and its rows

    def done() -> bool:
        size = log_path.stat().st_size
        if size == read["at"]:
            return False
        read.update(at=size, rows=read_table_rows(table))
        return enough(read["rows"])

    wait_for(done, timeout, f"rows in {table}", job)
    return read["rows"]


def run_job_available_now(
    path: str | Path,
    *,
    env: Mapping[str, str] | None = None,
    new_session: bool = False,
    timeout: float = 600,
) -> subprocess.CompletedProcess[str]:
    """`retrylib run PATH --available-now --master local[2]` as a user runs it (see
    `run_retrylib` for `env`, `new_session` and `timeout`)."""
    return run_retrylib(
        "run",
        str(path),
        "--available-now",
        "--master",
        "local[2]",
        env=env,
        new_session=new_session,
        timeout=timeout,
    )


def run_until(
    spark: SparkSession, config: Config, settled: Callable[[], bool], timeout: float = 120
) -> list[BatchResult]:
    """Run the job with its processing-time trigger until `settled()`, failing the test if
    the query dies or `timeout` seconds pass first; returns every batch's result.

    `settled` is asked again only after another batch's result (what it reads changes in
    batches only): a table read costs this session about 0.4 CPU-s, which the job's own
    batches would otherwise wait for."""
    results: list[BatchResult] = []
    query, batch_commit = start_query(spark, config, on_result=results.append)
    deadline = time.monotonic() + timeout
    asked_at = -1  # batch results when `settled` was last asked
    done = False
    try:
        while time.monotonic() < deadline:
            assert query.isActive, f"query died: {query.exception()}"
            if len(results) != asked_at:
                asked_at = len(results)
                done = settled()
                if done:
                    break
            time.sleep(0.25)
        assert query.isActive, f"query died: {query.exception()}"
    finally:
        stop_gracefully(query, batch_commit)
        batch_commit.close()
    # Asked once more only when time ran out: the batch the stop let finish may have settled it.
    done = done or settled()
    assert done, f"not settled after {timeout}s; batches: {[r.counters for r in results]}"
    return results


def run_available_now(spark: SparkSession, config: Config) -> list[BatchResult]:
    """Run the job with the availableNow trigger to its end (at most 180 s); returns every
    batch's result."""
    results: list[BatchResult] = []
    query, batch_commit = start_query(spark, config, available_now=True, on_result=results.append)
    try:
        assert query.awaitTermination(180), "the availableNow run did not stop by itself"
    finally:
        batch_commit.close()
    assert query.exception() is None
    return results


def settled_count(config: Config) -> int:
    """Records the job has finished with: rows in its output and dead-letter tables."""
    return read_table(config.output.table).num_rows + read_table(config.dead_letter.table).num_rows


def build_tests_session(warehouse: str | Path | None = None) -> SparkSession:
    """A SparkSession as the tests use it: local[2], two shuffle partitions, no UI, Spark's
    Python workers on this interpreter; its warehouse in `warehouse` when given. It can read
    `s3a://` (S3A's jars: the tests on S3 read the job's tables and checkpoint through it, and
    with pytest-xdist any test may have started it first); the `s3` fixture points it at the
    tests' S3 server."""
    from retrylib.dev.jars import s3_jars, spark_jars
    from retrylib.spark.session import build_spark_session

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    extra = {
        "spark.sql.shuffle.partitions": "2",
        "spark.ui.enabled": "false",
        # Delta's VACUUM lists a table in this many tasks: 10,000 by default, ~55 s on local[2].
        "spark.sql.sources.parallelPartitionDiscovery.parallelism": "2",
        "spark.jars": ",".join(str(jar) for jar in [*spark_jars(), *s3_jars()]),
    }
    if warehouse is not None:
        extra["spark.sql.warehouse.dir"] = str(warehouse)
    return build_spark_session("retrylib-tests", master="local[2]", extra=extra)


def tests_session() -> SparkSession:
    """The test process's SparkSession (the `spark` fixture's, or one made like it)."""
    return SparkSession.getActiveSession() or build_tests_session()


def read_table_rows(path: str) -> int:
    """The rows of the Delta table at `path`; 0 until the job has created it."""
    try:
        return read_table(path).num_rows
    except Exception:  # the table does not exist until the job has started
        return 0


def read_table(table: str) -> pa.Table:
    """The current snapshot of the Delta table at path `table`, as an Arrow table."""
    return tests_session().read.format("delta").load(table).toArrow()


def table_frame(spark: SparkSession, path: str) -> DataFrame:
    """The Delta table at `path` as a DataFrame with the table's own column types (a frame
    made from pandas would widen INT to BIGINT on Spark 4.0)."""
    return spark.read.format("delta").load(path)


def metrics_job_config(tmp_path: Path) -> Config:
    """A job "m" on topic "orders" with a do-nothing handler, two tiers and a metrics table,
    everything under `tmp_path` (no broker is contacted to load it)."""
    path = write_noop_job(
        tmp_path,
        name="m",
        job={"checkpoint": f"{tmp_path}/cp"},
        retry={"delays": ["10s", "1m"]},
        metrics={"table": f"{tmp_path}/metrics"},
    )
    return load_config(path)


@contextlib.contextmanager
def refusing_writes(directory: str | Path) -> Iterator[None]:
    """While inside, no file can be created in `directory`, not even by root (as the tests
    run in containers): `chattr +i` as root, a mode without write permission otherwise.
    Restored on the way out.
    """
    if os.geteuid() == 0:
        subprocess.run(["chattr", "+i", str(directory)], check=True)
        try:
            yield
        finally:
            subprocess.run(["chattr", "-i", str(directory)], check=True)
        return
    mode = os.stat(directory).st_mode
    os.chmod(directory, 0o555)
    try:
        yield
    finally:
        os.chmod(directory, mode)


def java_murmur2(key: bytes) -> int:
    """Kafka's `Utils.murmur2` of `key`: a signed 32-bit int, as Java returns it."""
    m = 0x5BD1E995
    h = (0x9747B28C ^ len(key)) & 0xFFFFFFFF
    whole = len(key) - len(key) % 4
    for i in range(0, whole, 4):
        k = (int.from_bytes(key[i : i + 4], "little") * m) & 0xFFFFFFFF
        k = ((k ^ (k >> 24)) * m) & 0xFFFFFFFF
        h = ((h * m) & 0xFFFFFFFF) ^ k
    tail = key[whole:]
    for shift, byte in reversed(list(enumerate(tail))):
        h ^= byte << (8 * shift)
    if tail:
        h = (h * m) & 0xFFFFFFFF
    h = ((h ^ (h >> 13)) * m) & 0xFFFFFFFF
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


def java_partition(key: bytes, partitions: int) -> int:
    """The partition Kafka's Java producer picks for `key`: `toPositive(murmur2(key))` modulo
    `partitions`, as its partitioner (and librdkafka's `murmur2_random`) does."""
    return (java_murmur2(key) & 0x7FFFFFFF) % partitions


def read_topic(
    bootstrap: str, topic: str, *, isolation: str = "read_committed", timeout_s: float = 60.0
) -> list[Message]:
    """Every record of `topic` (none when it does not exist) that a reader with `isolation`
    sees, up to the end offsets of when the read starts, in offset order per partition.

    Fails the test when the topic is not read to its end within `timeout_s`.
    """
    consumer = make_consumer(bootstrap, {**READ_TO_END_OPTIONS, "isolation.level": isolation})
    try:
        partitions = topic_partitions(consumer, [topic]).get(topic, [])
        read = ReadToEnd.from_earliest(consumer, [(topic, p) for p in partitions])
        messages = list(read.messages(timeout_s))
    finally:
        consumer.close()
    assert not read.unfinished, f"{topic} not read to its end in {timeout_s:.0f}s"
    return messages


TIER = "orders.retry.5s"
"""The first retry tier of the unit tests' `plan` fixture."""


def kafka_batch(rows: list[dict]) -> pa.RecordBatch:
    """Records as Spark's Kafka source hands them to a task: `rows` give the columns that
    differ from a record on "orders", partition 1, read now, with no headers."""
    now = datetime.now(UTC)
    full = [
        {
            "value": b"v",
            "topic": "orders",
            "partition": 1,
            "timestamp": now,
            "timestampType": 0,
            "headers": [],
            **row,
        }
        for row in rows
    ]
    for row in full:
        row["headers"] = [{"key": k, "value": v} for k, v in row["headers"]]
    return pa.RecordBatch.from_pylist(full, schema=KAFKA_ARROW_SCHEMA)


def route(plan: TaskPlan, rows: list[dict]) -> tuple[dict, dict[str, list[dict]]]:
    """Run the executor task on one batch of `rows`: its counters, and the rows it wrote by
    kind (`KINDS`: "output", "dead_letter", `OUTGOING_KIND`, "lateness", ...)."""
    batches = list(run_task(plan, iter([kafka_batch(rows)])))
    assert all(batch.schema == result_schema(plan.output_schema) for batch in batches)
    results = pa.Table.from_batches(batches).to_pylist()
    [counters] = [json.loads(r["counters"]) for r in results if r["kind"] == "counters"]
    written: dict[str, list[dict]] = {kind: [] for kind in KINDS}
    for row in results:
        if row["kind"] != "counters":
            written[row["kind"]].append(row[row["kind"]])
    return counters, written


def outgoing_headers(record: dict) -> list[tuple[str, bytes | None]]:
    """An outgoing record's headers as (key, value) pairs."""
    return [(h["key"], h["value"]) for h in record["headers"]]


class FakeKafka:
    """A `retrylib_kafka` stream reader's `_Metadata` (no broker): partitions, and offsets by
    earliest / latest / time.

    A partition's answer for a time is its `due` offset (its records stamped no later than
    now), or, for a partition given its records' timestamps in `stamps`, the first offset
    stamped at or after the time, as Kafka's time index answers.
    """

    def __init__(
        self,
        latest: Offsets,
        due: Offsets | None = None,
        stamps: Mapping[tuple[str, int], list[int]] | None = None,
    ) -> None:
        self.latest = dict(latest)
        self.due = dict(due or {})
        self.stamps = dict(stamps or {})
        self.scanned: list[dict] = []

    def partitions(self) -> list[tuple[str, int]]:
        return sorted(self.latest)

    def list_offsets(self, partitions, timestamp: int) -> Offsets:
        if timestamp == LATEST:
            return {key: self.latest[key] for key in partitions}
        if timestamp == EARLIEST:
            return dict.fromkeys(partitions, 0)
        ahead = timestamp > time.time() * 1000
        return {key: self._first_at(key, timestamp, ahead) for key in partitions}

    def _first_at(self, key: tuple[str, int], timestamp: int, ahead: bool) -> int:
        if key not in self.stamps:
            return -1 if ahead else self.due.get(key, -1)
        return next((i for i, stamp in enumerate(self.stamps[key]) if stamp >= timestamp), -1)

    def scan_timestamps(self, begin, latest, scan) -> dict:
        self.scanned.append(dict(begin))
        for key, offset in begin.items():
            for at in range(offset, latest[key]):
                scan.see(key, at, self.stamps[key][at])
        return {}

    def holding_records(self, tails) -> set[tuple[str, int]]:
        return set(tails)  # every offset of this Kafka holds a record: no marker-only tail

    def close(self) -> None:
        pass


def reader_for(kafka: FakeKafka, **options: str) -> KafkaStreamReader:
    """A stream reader of topic "orders" with `options`, asking `kafka` instead of a broker."""
    reader = KafkaStreamReader(
        parse_source_options(
            {"kafka.bootstrap.servers": "b:9092", "subscribe": "orders", **options}
        )
    )
    reader._metadata = kafka
    return reader
