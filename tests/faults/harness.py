"""Fault-injection harness: run the real job, kill it over and over, prove exactly-once effects.

Each round produces a wave of input records (successes, transient failures that succeed on
the 2nd or 3rd call, failures that always fail, non-retryable failures), then runs the job
as a subprocess (`python -m retrylib run CONF --master local[2]`, or `./spark-submit.sh
CONF`; processing-time trigger) from the same checkpoint, and ends it in one of three ways:

- point: the crash listener (tests/faults/crash/) SIGKILLs the job's whole process group
  (driver, JVM, Python workers) when the job reaches the named step (`retrylib.steps`) of
  its start or of a batch; the start's steps come first in a sweep, in the order a first
  start reaches them.
- random: the harness SIGKILLs the process group at a random moment.
- broker: the harness stops the embedded broker and starts it again on the same port and
  data dir while the job runs; the job must ride through or exit non-zero (never 0 with
  anything lost); it is then stopped (SIGINT) and the next round restarts it.

A last run without faults drains the retry tiers, then the checks compare (with chispa's
assert_df_equality, row order ignored):

- the output table with the expected rows (each success exactly once, with the attempt it
  succeeded on), nothing extra;
- the dead-letter table with the records that always fail (attempts = max_attempts) and the
  non-retryable ones (attempts = 1), once each; the dead-letter topic likewise;
- the retry tiers: no (record id, attempt) twice, and no attempt past what the record needs;
- every input record accounted for: in the output, dead-lettered, or (if a check runs
  before the drain finished) waiting in a retry tier;
- the file a run planted before the first start that reaches the query (what a kill while
  Spark wrote batch 0's offsets leaves: `spark/offsets/.0.<uuid>.tmp`, on a local disk with
  its checksum) was removed by a start, which logged it. Spark 4.1+ refuses a first batch
  while that folder holds anything, so a kill landing in that write wedged every later start.

Run by hand for a soak:  .venv/bin/python tests/faults/harness.py --rounds 40 --seed 7
pytest uses `FaultHarness` and `plan_rounds` (tests/integration/test_crash_recovery.py).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa

from retrylib.dev.broker import EmbeddedBroker
from retrylib.kafka.clients import ensure_topics, make_admin, make_producer
from retrylib.retry.headers import ATTEMPT, ATTEMPTS, DEAD_LETTER_REASON, ID, record_id
from retrylib.state.checkpoint import Checkpoint
from retrylib.state.files import list_names
from retrylib.steps import BATCH_STEPS, START_STEPS, STEPS

# tests/, for the helpers shared by the tests, when this file runs as a script
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from faults.crash.crash_points import crash_env
from helpers import (
    JVM_OPTIONS,
    job_env,
    read_table,
    read_topic,
    retrylib_command,
    tests_session,
    write_job_toml,
)

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
JOB = "faults"
MAX_ATTEMPTS = 3
DELAYS = ("1s", "2s")
KINDS = (("ok", 0.55), ("flaky1", 0.15), ("flaky2", 0.12), ("always", 0.09), ("bad", 0.09))
_CRASH_LINE = re.compile(r"retrylib fault injection: crash at (\w+) in batch (-?\d+)")
BEFORE_QUERY = frozenset(START_STEPS) - {"after_query_start"}
"""The start's steps before the query starts: a round that crashes there reads no records."""
TABLES = ("output", "dead_letter")
"""The tables a first start creates, in order: each has an `in_table_create` round."""
FILE_SYSTEM_POINTS = (
    "after_main_reader",
    "after_identity",
    "after_signing_key",
    "in_table_create",
    "after_manifest",
    "after_cleanup",
)
"""One crash point of each kind of write that differs by file system: a file replaced (the
reader), a file claimed (the identity, the signing key), a table's creation (the output's;
the dead-letter table's is the same), a batch's manifest, and the cleanup of a batch's state.
The HDFS and S3 sweeps take these (the local sweep takes every point)."""
_BATCH_LINE = re.compile(r"retrylib\.batch\.commit: batch (\{.*\})")
_QUERY_UP = re.compile(r"retrylib\.batch\.commit: batch |retrylib\.job: main topics read with")


@dataclass(frozen=True)
class Round:
    """One run of the job and how it ends: kind is "point", "random" or "broker"."""

    kind: str
    point: str | None = None
    table: str | None = None  # in_table_create: which of TABLES, killed inside its creation
    fraction: float = 1.0  # random kills: when, as a fraction of the typical start-up time
    outage_seconds: float = 0.0  # broker restarts: how long the broker stays down

    @property
    def name(self) -> str:
        """The round's point (with its table), or its kind."""
        if self.table is not None:
            return f"{self.point}:{self.table}"
        return self.point or self.kind


@dataclass
class Outcome:
    round: Round
    index: int
    returncode: int | None
    seconds: float
    crashed_at: str | None
    crashed_batch: int | None
    batches: int
    replayed: int
    note: str
    log: Path

    def line(self) -> str:
        what = self.round.name
        crash = f" crashed at {self.crashed_at}@{self.crashed_batch}" if self.crashed_at else ""
        return (
            f"round {self.index:2d} {self.round.kind:6s} {what:24s} rc={self.returncode} "
            f"{self.seconds:5.1f}s batches={self.batches} replayed={self.replayed}{crash} "
            f"{self.note}"
        )


@dataclass
class InputRecord:
    key: str
    value: str
    partition: int
    offset: int

    @property
    def kind(self) -> str:
        return self.key.split("-", 1)[0]


@dataclass
class Report:
    outcomes: list[Outcome] = field(default_factory=list)
    inputs: int = 0
    drain_seconds: float = 0.0
    calls: Counter[str] = field(default_factory=Counter)

    def summary(self) -> str:
        by_kind = Counter(o.round.name + (" hit" if o.crashed_at else "") for o in self.outcomes)
        lines = [o.line() for o in self.outcomes]
        lines.append(f"inputs={self.inputs} drain={self.drain_seconds:.1f}s")
        lines.append("rounds: " + ", ".join(f"{k}={v}" for k, v in sorted(by_kind.items())))
        return "\n".join(lines)


def plan_rounds(
    seed: int,
    *,
    rounds: int | None = None,
    points: Sequence[str] = STEPS,
    random_kills: int = 3,
    broker_restarts: int = 1,
) -> list[Round]:
    """The rounds of a run. Without `rounds`: each crash point once (`in_table_create` once
    per table), `random_kills` random kills and `broker_restarts` broker restarts. The
    start-up points come first, in the order a first start reaches them, so that each one
    meets the state the crashes before it left (`in_table_create` is reached only while a
    table is being created); the rest are shuffled. With `rounds`: that many, the crash
    points other than `in_table_create` taken in turn for half of them, the rest random
    kills and (one in five) broker restarts, some of them with an outage long enough to make
    the job give up."""
    rng = random.Random(seed)

    def random_kill() -> Round:
        return Round("random", fraction=rng.uniform(0.3, 1.3))

    def broker_restart(long_ones: bool = False) -> Round:
        if long_ones and rng.random() < 0.3:  # past the clients' timeouts: the job must fail
            return Round("broker", outage_seconds=rng.uniform(35.0, 50.0))
        return Round("broker", outage_seconds=rng.uniform(0.5, 4.0))

    if rounds is None:
        start = [
            Round("point", point=p, table=table)
            for p in START_STEPS
            if p in points
            for table in (TABLES if p == "in_table_create" else (None,))
        ]
        plan = [Round("point", point=p) for p in points if p not in START_STEPS]
        plan += [random_kill() for _ in range(random_kills)]
        plan += [broker_restart() for _ in range(broker_restarts)]
        rng.shuffle(plan)
        return start + plan
    every_start = [p for p in points if p != "in_table_create"]
    plan, turn = [], 0
    for _ in range(rounds):
        draw = rng.random()
        if draw < 0.5:
            plan.append(Round("point", point=every_start[turn % len(every_start)]))
            turn += 1
        elif draw < 0.6:
            plan.append(broker_restart(long_ones=True))
        else:
            plan.append(random_kill())
    return plan


def file_system_plan(seed: int) -> list[Round]:
    """The rounds of a sweep of another file system: `FILE_SYSTEM_POINTS`, the output's
    table creation alone (the dead-letter table's is made the same way), no random kills or
    broker restarts."""
    rounds = plan_rounds(seed, points=FILE_SYSTEM_POINTS, random_kills=0, broker_restarts=0)
    return [spec for spec in rounds if spec.table != "dead_letter"]


class FaultsJob:
    """A job of `fault_handlers:handle` reading `topic` on `bootstrap_servers`, its config in
    `workdir`, its checkpoint and tables under `state` (default: `workdir`): its config, the
    inputs produced for it, and the checks of its effects (see the module docstring). The
    harness runs one over and over; a test can run one its own way (another master, another
    entry point) and check it the same way.

    `state_here` is where this process finds `state` when the job resolves it otherwise: a
    plain path on a cluster whose default file system is HDFS is an `hdfs://` URI here."""

    def __init__(
        self,
        bootstrap_servers: str,
        topic: str,
        workdir: str | Path,
        *,
        name: str = JOB,
        partitions: int = 2,
        state: str | None = None,
        state_here: str | None = None,
    ) -> None:
        self.bootstrap_servers = bootstrap_servers
        self.topic = topic
        self.workdir = Path(workdir)
        self.name = name
        self.partitions = partitions
        self.state = state or str(self.workdir)
        self.state_here = state_here or self.state
        self.inputs: list[InputRecord] = []
        self._waves = 0
        self._sections: dict[str, dict] = {}

    def table(self, which: str) -> str:
        """One of `TABLES` as the job's config names it."""
        return f"{self.state}/{'out' if which == 'output' else 'dlq'}"

    @property
    def output_table(self) -> str:
        return self.table("output")

    @property
    def dead_letter_table(self) -> str:
        return self.table("dead_letter")

    def _read_table(self, which: str) -> pa.Table:
        return read_table(self.table(which).replace(self.state, self.state_here, 1))

    @property
    def dead_letter_topic(self) -> str:
        return f"{self.topic}.dlt"

    @property
    def tier_topics(self) -> list[str]:
        return [f"{self.topic}.{self.name}.retry.{delay}" for delay in DELAYS]

    def write_config(self, **sections: dict) -> Path:
        """Write workdir/job.toml: two retry tiers (DELAYS), MAX_ATTEMPTS, ValueError
        non-retryable, a dead-letter topic and table. `sections` update its tables key by
        key (`kafka={"max_offsets_per_trigger": 100}`)."""
        from fault_handlers import OUTPUT_SCHEMA

        self._sections = sections

        tables: dict[str, dict] = {
            "handler": {
                "function": "fault_handlers:handle",
                "output_schema": OUTPUT_SCHEMA,
                "paths": [HERE],
            },
            "job": {"checkpoint": f"{self.state}/checkpoint", "trigger": "500ms"},
            "kafka": {"starting_offsets": "earliest"},
            "output": {"table": self.output_table},
            "retry": {
                "delays": list(DELAYS),
                "max_attempts": MAX_ATTEMPTS,
                "non_retryable": ["ValueError"],
            },
            "dead_letter": {"topic": self.dead_letter_topic, "table": self.dead_letter_table},
        }
        for section, changes in sections.items():
            tables.setdefault(section, {}).update(changes)
        return write_job_toml(
            self.workdir / "job.toml",
            topics=[self.topic],
            name=self.name,
            bootstrap_servers=self.bootstrap_servers,
            **tables,
        )

    def name_state(self, state: str) -> Path:
        """Name the same place `state` in the config from now on (a plain path where it was a
        URI, or the other way round) and write the config again."""
        self.state = state
        return self.write_config(**self._sections)

    def produce_wave(self, rng: random.Random, size: int) -> list[InputRecord]:
        """Produce `size` new input records of mixed kinds (drawn with `rng`), round-robin
        over the partitions; remember where each landed and return them."""
        wave, self._waves = self._waves, self._waves + 1
        kinds = [name for name, _ in KINDS]
        weights = [weight for _, weight in KINDS]
        producer = make_producer(self.bootstrap_servers, {})
        landed: list[InputRecord] = []

        def delivered(error, message) -> None:
            if error is not None:
                raise RuntimeError(f"producing input failed: {error}")
            landed.append(
                InputRecord(
                    message.key().decode(),
                    message.value().decode(),
                    message.partition(),
                    message.offset(),
                )
            )

        for i in range(size):
            kind = rng.choices(kinds, weights)[0]
            producer.produce(
                self.topic,
                key=f"{kind}-w{wave}-{i}".encode(),
                value=f"v{wave}-{i}".encode(),
                partition=i % self.partitions,
                on_delivery=delivered,
            )
        if producer.flush(30):
            raise RuntimeError("input records not delivered in 30s")
        self.inputs.extend(landed)
        return landed

    def settled_count(self) -> int:
        """Rows in the output and dead-letter tables (fails until both exist)."""
        return self._read_table("output").num_rows + self._read_table("dead_letter").num_rows

    def wait_settled(
        self, process: subprocess.Popen, log: Path, *, timeout: float, settle: float
    ) -> str:
        """Wait, at most `timeout` seconds and while `process` (the job, writing `log`)
        runs, until the output and dead-letter tables hold a row per input and have not
        changed for `settle` seconds (longer than the longest retry delay); returns what
        happened ("settled at N of M", "timed out").

        The tables are read again only once the job has logged another batch (they change
        in batches only): reading them every second would take a core of a small machine
        from the job."""
        expected = len(self.inputs)
        deadline = time.monotonic() + timeout
        last, stable_since, note = -1, time.monotonic(), "timed out"
        up, counted_at = False, -1  # batches logged when the tables were last read
        while time.monotonic() < deadline and process.poll() is None:
            time.sleep(1.0)
            text = log.read_text(errors="replace")
            if not up:  # settled only counts while the query runs (and could add more)
                up = bool(_QUERY_UP.search(text))
                stable_since = time.monotonic()
                continue
            batches = len(_BATCH_LINE.findall(text))
            if batches != counted_at:
                try:
                    count = self.settled_count()
                except Exception:  # the tables may not exist before the first start
                    continue
                counted_at = batches
                if count != last:
                    last, stable_since = count, time.monotonic()
            if last >= expected and time.monotonic() - stable_since >= settle:
                note = f"settled at {last} of {expected}"
                break
        return note

    def expected_output(self) -> list[tuple]:
        attempts = {"ok": 0, "flaky1": 1, "flaky2": 2}
        return [
            (r.key, r.value, self.topic, r.partition, r.offset, attempts[r.kind])
            for r in self.inputs
            if r.kind in attempts
        ]

    def expected_dead_letters(self) -> list[tuple]:
        outcome = {"always": (MAX_ATTEMPTS, "attempts_exhausted"), "bad": (1, "non_retryable")}
        return [
            (self.topic, r.partition, r.offset, r.key, *outcome[r.kind])
            for r in self.inputs
            if r.kind in outcome
        ]

    def check(self, spark) -> None:
        """Assert exactly-once effects for every input (see the module docstring); raises
        AssertionError naming the first broken part."""
        from chispa import assert_df_equality
        from fault_handlers import OUTPUT_SCHEMA

        output = self._read_table("output").to_pylist()
        dead = self._read_table("dead_letter").to_pylist()
        tiers = [h for topic in self.tier_topics for h in self._topic_records(topic)]
        dlt = self._topic_records(self.dead_letter_topic)
        self._check_accounting(output, dead, tiers)

        actual = spark.createDataFrame(
            [tuple(row[c] for c in _columns(OUTPUT_SCHEMA)) for row in output], OUTPUT_SCHEMA
        )
        expected = spark.createDataFrame(self.expected_output(), OUTPUT_SCHEMA)
        assert_df_equality(actual, expected, ignore_row_order=True)

        dead_schema = (
            "origin_topic STRING, origin_partition INT, origin_offset BIGINT, key STRING, "
            "attempts INT, reason STRING"
        )
        actual_dead = spark.createDataFrame(
            [
                (
                    d["origin_topic"],
                    d["origin_partition"],
                    d["origin_offset"],
                    d["key"].decode(),
                    d["attempts"],
                    d["reason"],
                )
                for d in dead
            ],
            dead_schema,
        )
        expected_dead = spark.createDataFrame(self.expected_dead_letters(), dead_schema)
        assert_df_equality(actual_dead, expected_dead, ignore_row_order=True)

        dlt_rows = [(h[ID].decode(), int(h[ATTEMPTS]), h[DEAD_LETTER_REASON].decode()) for h in dlt]
        expected_dlt = [
            (record_id(self.name, t, p, o), attempts, reason)
            for t, p, o, _, attempts, reason in self.expected_dead_letters()
        ]
        assert sorted(dlt_rows) == sorted(expected_dlt), (
            f"dead-letter topic: {len(dlt_rows)} records, expected {len(expected_dlt)}; "
            f"twice: {_repeated(r[0] for r in dlt_rows)[:5]}"
        )
        needed = {"flaky1": 1, "flaky2": 2, "always": MAX_ATTEMPTS - 1}
        by_id = {self._record_id(r): r for r in self.inputs}
        pairs = [(h[ID].decode(), int(h[ATTEMPT])) for h in tiers]
        twice = _repeated(pairs)
        assert not twice, f"retry tiers hold {len(twice)} (id, attempt) twice: {twice[:5]}"
        expected_pairs = sorted(
            (rid, attempt)
            for rid, r in by_id.items()
            for attempt in range(1, needed.get(r.kind, 0) + 1)
        )
        assert sorted(pairs) == expected_pairs, (
            f"retry tiers: {len(pairs)} records, expected {len(expected_pairs)}; extra "
            f"{sorted(set(pairs) - set(expected_pairs))[:5]}, missing "
            f"{sorted(set(expected_pairs) - set(pairs))[:5]}"
        )

    def _check_accounting(self, output: list[dict], dead: list[dict], tiers: list[dict]) -> None:
        """Every input is in the output or dead-lettered (once), else waiting in a tier."""
        in_output = Counter((r["partition"], r["offset"]) for r in output)
        in_dead = Counter((d["origin_partition"], d["origin_offset"]) for d in dead)
        twice = [k for k, n in (in_output + in_dead).items() if n > 1]
        assert not twice, f"{len(twice)} input record(s) have more than one effect: {twice[:5]}"
        waiting_ids = {h[ID].decode() for h in tiers}
        missing, waiting = [], []
        for r in self.inputs:
            where = (r.partition, r.offset)
            if where in in_output or where in in_dead:
                continue
            (waiting if self._record_id(r) in waiting_ids else missing).append(r.key)
        assert not missing, f"{len(missing)} input record(s) unaccounted for: {missing[:10]}"
        assert not waiting, f"{len(waiting)} record(s) still in a retry tier after the drain"
        positions = {(r.partition, r.offset) for r in self.inputs}
        extra = [r for r in output if (r["partition"], r["offset"]) not in positions]
        assert not extra, f"{len(extra)} output row(s) match no input: {extra[:3]}"

    def _record_id(self, record: InputRecord) -> str:
        return record_id(self.name, self.topic, record.partition, record.offset)

    def _topic_records(self, topic: str) -> list[dict]:
        """The retrylib headers of every committed record of `topic`, read from the start."""
        return [dict(m.headers() or ()) for m in read_topic(self.bootstrap_servers, topic)]


class FaultHarness:
    """Owns a broker, a job config and a checkpoint under `workdir`; see the module docstring."""

    def __init__(
        self,
        workdir: str | Path,
        seed: int,
        *,
        wave_size: int = 60,
        partitions: int = 2,
        round_timeout: float = 150.0,
        master: str = "local[2]",
        source: str = "auto",
        say: Callable[[str], None] = print,
        entry: str = "retrylib",
        state: str | None = None,
        state_here: str | None = None,
        other_state_name: str | None = None,
        spark_conf: Mapping[str, str] | None = None,
        job_environment: Mapping[str, str] | None = None,
        wipe_driver_disk: bool = False,
    ) -> None:
        """`master`: Spark's master for the job; "local[N,F]" lets a task fail F times.
        `source`: the job's `kafka.source`. `entry`: how the job is started, "retrylib"
        (`retrylib run`) or "spark-submit" (`./spark-submit.sh`). `state`, `state_here`: where
        the checkpoint and tables live (`FaultsJob`); `other_state_name`: another name of the
        same place (a plain path's URI), which every other round's config uses, as an operator
        who respells a path does. `spark_conf`: Spark settings of the job
        (`spark.hadoop.fs.defaultFS`). `job_environment`: variables every start of the job
        gets (`RETRYLIB_SPARK_JARS`, `RETRYLIB_SPARK_CONF`). `wipe_driver_disk`: the job's
        temporary folders (Python's, Java's, Spark's local dir) are emptied before each
        start, as a driver that comes back on another node finds them."""
        # fault_handlers, for the config and the checks; tests/ for helpers
        for path in (str(HERE.parent), str(HERE)):
            if path not in sys.path:
                sys.path.insert(0, path)
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.rng = random.Random(seed)
        self.wave_size = wave_size
        self.partitions = partitions
        self.round_timeout = round_timeout
        self.master = master
        self.source = source
        self.say = say
        self.entry = entry
        self.state, self.state_here = state, state_here
        self.other_state_name = other_state_name
        self.spark_conf = dict(spark_conf or {})
        self.job_environment = dict(job_environment or {})
        self.wipe_driver_disk = wipe_driver_disk
        self.driver_disk = self.workdir / "driver-disk"
        self.topic = f"orders-{seed}"
        self.report = Report()
        self.startup_seconds: list[float] = []
        self.calls_log = self.workdir / "calls.log"
        self.broker = EmbeddedBroker(data_dir=self.workdir / "broker")
        self._process: subprocess.Popen[bytes] | None = None
        self.planted: tuple[int, str] | None = None  # the round it preceded, the file's name

    # -- setting up -----------------------------------------------------------------------

    def __enter__(self) -> FaultHarness:
        self.broker.start()
        ensure_topics(
            make_admin(self.broker.bootstrap_servers, {}),
            {self.topic: self.partitions},
            create=True,
        )
        self.job = FaultsJob(
            self.broker.bootstrap_servers,
            self.topic,
            self.workdir,
            partitions=self.partitions,
            state=self.state,
            state_here=self.state_here,
        )
        self.config_path = self.job.write_config(kafka={"source": self.source})
        return self

    def __exit__(self, *exc: object) -> None:
        self._kill_job()
        self.broker.stop()

    @property
    def inputs(self) -> list[InputRecord]:
        return self.job.inputs

    def produce_wave(self, size: int | None = None) -> None:
        """Produce `size` new input records of mixed kinds; remember where each landed."""
        self.job.produce_wave(self.rng, size or self.wave_size)
        self.report.inputs = len(self.inputs)

    # -- running the job ------------------------------------------------------------------

    def _start_job(self, log: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
        java_options = f"{JVM_OPTIONS} -Xss4m"
        conf = dict(self.spark_conf)
        scratch: dict[str, str] = {}
        if self.wipe_driver_disk:
            shutil.rmtree(self.driver_disk, ignore_errors=True)
            self.driver_disk.mkdir()
            java_options += f" -Djava.io.tmpdir={self.driver_disk}"
            conf["spark.local.dir"] = str(self.driver_disk)
            scratch["TMPDIR"] = str(self.driver_disk)
        submit_args = ["--driver-memory 768m", *(f"--conf {k}={v}" for k, v in conf.items())]
        full_env = job_env(
            {
                "RETRYLIB_LOG_LEVEL": "INFO",
                "RETRYLIB_FAULTS_CALL_LOG": str(self.calls_log),
                **self.job_environment,
                **scratch,
                **env,
            }
        )
        if self.entry == "spark-submit":
            # spark-submit.sh splits its extra options at spaces: the JVM's options go apart,
            # after the tests' own (the class archive's, tests/jvm_class_archive.py).
            inherited = os.environ.get("SPARK_SUBMIT_OPTS", "")
            full_env["SPARK_SUBMIT_OPTS"] = f"{inherited} {java_options}".strip()
            full_env["RETRYLIB_SPARK_EXTRA"] = " ".join(["--master", self.master, *submit_args])
            # spark-submit.sh execs the JVM, which starts the driver: the crash listener of
            # every process of the job kills this shell's process group, the whole job.
            command = [
                "bash",
                "-c",
                'export RETRYLIB_CRASH_GROUP=$$; exec "$0" "$@"',
                str(REPO / "spark-submit.sh"),
                str(self.config_path),
            ]
        else:
            full_env["PYSPARK_SUBMIT_ARGS"] = " ".join(
                [f'--driver-java-options "{java_options}"', *submit_args, "pyspark-shell"]
            )
            command = retrylib_command("run", str(self.config_path), "--master", self.master)
        # Opened for appending, so that every writer of the log writes at its end: the crash
        # listener appends its line through /proc (crash_points._kill_now) while the JVM
        # writes through this descriptor, whose own offset would write over that line.
        with open(log, "ab") as out:
            self._process = subprocess.Popen(
                command,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=REPO,
                env=full_env,
                start_new_session=True,  # its own process group: JVM and workers die with it
            )
        return self._process

    def _kill_job(self) -> None:
        process, self._process = self._process, None
        if process is None:
            return
        if process.poll() is None:
            with _suppress_lookup():
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        with _suppress_lookup():  # the JVM may outlive a driver killed alone
            os.killpg(process.pid, signal.SIGKILL)

    def _stop_job(self, timeout: float = 60.0) -> int | None:
        """SIGINT the job (it stops after the current batch); SIGKILL it if it hangs."""
        process = self._process
        if process is None:
            return None
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
            try:
                process.wait(timeout)
            except subprocess.TimeoutExpired:
                pass
        returncode = process.poll()
        self._kill_job()
        return returncode

    def _typical_startup(self) -> float:
        if not self.startup_seconds:
            return 25.0
        return sorted(self.startup_seconds)[len(self.startup_seconds) // 2]

    def _plant_unfinished_offsets(self) -> str:
        """Leave in the checkpoint what a kill while Spark wrote batch 0's offsets leaves (a
        CI run's kill at after_query_start did): the file under Spark's temporary name, empty,
        with its checksum where the file system keeps one (Hadoop's local one does, HDFS does
        not). Returns its name."""
        name = f".0.{uuid.uuid4()}.tmp"
        spark = tests_session()
        folder = Checkpoint(f"{self.job.state_here}/checkpoint").spark
        path = spark._jvm.org.apache.hadoop.fs.Path(f"{folder}/offsets/{name}")
        path.getFileSystem(spark._jsc.hadoopConfiguration()).create(path, False).close()
        return name

    def run_round(self, index: int, spec: Round) -> Outcome:
        if spec.point not in BEFORE_QUERY:  # a round that crashes before it reads no records
            self.produce_wave()
            if self.planted is None:
                self.planted = (index, self._plant_unfinished_offsets())
        if self.other_state_name is not None:
            self.job.name_state(self.other_state_name if index % 2 else self.state)
        log = self.workdir / f"round-{index:02d}-{spec.name.replace(':', '-')}.log"
        env = {}
        if spec.point is not None:
            watch = None if spec.table is None else f"{self.job.table(spec.table)}/_delta_log"
            env = crash_env(spec.point, watch=watch)
        started = time.monotonic()
        process = self._start_job(log, env)
        note = ""
        if spec.kind == "point":
            try:
                process.wait(self.round_timeout)
            except subprocess.TimeoutExpired:
                note = "point not reached"
        elif spec.kind == "random":
            delay = spec.fraction * self._typical_startup()
            try:
                process.wait(delay)
                note = f"exited by itself before the kill at {delay:.1f}s"
            except subprocess.TimeoutExpired:
                note = f"killed at {delay:.1f}s"
        else:
            note = self._broker_restart(process, log, spec)
        returncode = process.poll()
        if returncode is None:
            if spec.kind == "broker":
                returncode = self._stop_job()
            else:
                self._kill_job()
                returncode = -signal.SIGKILL
        else:
            self._kill_job()
        text = log.read_text(errors="replace")
        crash = _CRASH_LINE.search(text)
        outcome = Outcome(
            spec,
            index,
            returncode,
            time.monotonic() - started,
            crash.group(1) if crash else None,
            int(crash.group(2)) if crash else None,
            len(logged_batches(text)),
            sum(1 for b in logged_batches(text) if b.get("replayed")),
            note,
            log,
        )
        if crash and spec.point in BATCH_STEPS:
            self.startup_seconds.append(outcome.seconds)
        self.report.outcomes.append(outcome)
        self.say(outcome.line())
        return outcome

    def _broker_restart(self, process: subprocess.Popen[bytes], log: Path, spec: Round) -> str:
        """Restart the broker once the job has run a batch; watch how the job takes it."""
        deadline = time.monotonic() + self.round_timeout
        while time.monotonic() < deadline and process.poll() is None:
            if _BATCH_LINE.search(log.read_text(errors="replace")):
                break
            time.sleep(0.2)
        time.sleep(self.rng.uniform(0.0, 1.5))
        batches_before = len(_BATCH_LINE.findall(log.read_text(errors="replace")))
        self.broker.stop()
        time.sleep(spec.outage_seconds)
        self.broker.start()
        self.produce_wave(self.wave_size // 2)  # new work that needs the restarted broker
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and process.poll() is None:
            batches = len(_BATCH_LINE.findall(log.read_text(errors="replace")))
            if batches >= batches_before + 2:
                return f"rode through a {spec.outage_seconds:.1f}s outage"
            time.sleep(0.5)
        if process.poll() is not None:
            return f"exited rc={process.returncode} after a {spec.outage_seconds:.1f}s outage"
        return f"no batch within 60s of a {spec.outage_seconds:.1f}s outage"

    def drain(
        self, timeout: float = 180.0, settle: float = 6.0, env: dict[str, str] | None = None
    ) -> Outcome:
        """Run the job until every input is in the output or dead-lettered and nothing
        changes for `settle` seconds (longer than the longest retry delay); `env` may ask for
        faults the job rides through (`crash_env(..., once=...)`)."""
        index = len(self.report.outcomes)
        log = self.workdir / f"round-{index:02d}-drain.log"
        started = time.monotonic()
        process = self._start_job(log, env or {})
        note = self.job.wait_settled(process, log, timeout=timeout, settle=settle)
        returncode = self._stop_job()
        text = log.read_text(errors="replace")
        outcome = Outcome(
            Round("drain"),
            index,
            returncode,
            time.monotonic() - started,
            None,
            None,
            len(logged_batches(text)),
            sum(1 for b in logged_batches(text) if b.get("replayed")),
            note,
            log,
        )
        self.report.drain_seconds = outcome.seconds
        self.report.outcomes.append(outcome)
        self.say(outcome.line())
        return outcome

    def run(self, plan: Sequence[Round]) -> Report:
        for index, spec in enumerate(plan):
            self.run_round(index, spec)
        self.drain()
        self.report.calls = self._calls()
        return self.report

    def sweep(self, plan: Sequence[Round], spark) -> Report:
        """`run` the plan, assert each point round was killed at its point (SIGKILL), then
        `check`; returns the report."""
        report = self.run(plan)
        summary = f"{report.summary()}\n\n{self.log_tails()}"
        for outcome in report.outcomes:
            if outcome.round.kind == "point":
                assert outcome.crashed_at == outcome.round.point, summary
                assert outcome.returncode == -9, f"round {outcome.index} died:\n{summary}"
        self.check(spark)
        self.say(report.summary())
        return report

    def expected_calls(self) -> int:
        """Handler calls the inputs need without any replay."""
        calls = {"ok": 1, "flaky1": 2, "flaky2": 3, "always": MAX_ATTEMPTS, "bad": 1}
        return sum(calls[r.kind] for r in self.inputs)

    def _calls(self) -> Counter[str]:
        if not self.calls_log.exists():
            return Counter()
        return Counter(line.split()[0] for line in self.calls_log.read_text().splitlines())

    # -- checking -------------------------------------------------------------------------

    def check(self, spark) -> None:
        """Assert the promise (see the module docstring); raises AssertionError naming the
        first broken part, with the tails of the round logs."""
        try:
            self.job.check(spark)
            self._check_planted_removed()
        except AssertionError as e:
            raise AssertionError(f"{e}\n\n{self.report.summary()}\n\n{self.log_tails()}") from e

    def _check_planted_removed(self) -> None:
        if self.planted is None:
            return
        index, name = self.planted
        removed = re.compile(rf"removed \S*/offsets/{re.escape(name)}: Spark was writing it")
        logs = [o.log.read_text(errors="replace") for o in self.report.outcomes[index:]]
        assert any(removed.search(text) for text in logs), (
            f"no start after round {index} logged removing offsets/{name}, which the harness "
            "planted before it"
        )
        offsets = Checkpoint(f"{self.job.state_here}/checkpoint").spark + "/offsets"
        left = [n for n in list_names(tests_session(), offsets) if name in n]
        assert not left, f"{left} still in {offsets}"

    def log_tails(self, lines: int = 25) -> str:
        parts = []
        for outcome in self.report.outcomes[-4:]:
            text = outcome.log.read_text(errors="replace").splitlines()
            useful = [t for t in text if not t.startswith("%")]
            parts.append(f"--- {outcome.log.name} (last {lines} lines) ---")
            parts.extend(useful[-lines:])
        return "\n".join(parts)


def logged_batches(log_text: str) -> list[dict]:
    """The counters of each batch a job's log reports, in log order (`retrylib.batch.commit`'s
    INFO lines: "batch {...}", with "batch_id")."""
    return [json.loads(line) for line in _BATCH_LINE.findall(log_text)]


def _columns(ddl: str) -> list[str]:
    return [part.strip().split()[0] for part in ddl.split(",")]


def _repeated(items) -> list:
    return [item for item, count in Counter(items).items() if count > 1]


@contextmanager
def _suppress_lookup() -> Iterator[None]:
    try:
        yield
    except (ProcessLookupError, PermissionError):
        pass


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--rounds",
        type=int,
        help="soak: this many rounds (default: one per "
        "crash point, --random-kills random kills, --broker-restarts restarts)",
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--random-kills", type=int, default=3)
    parser.add_argument("--broker-restarts", type=int, default=1)
    parser.add_argument("--wave-size", type=int, default=60)
    parser.add_argument(
        "--points", help="comma-separated crash points to use (default: all of them)"
    )
    parser.add_argument(
        "--workdir", help="keep everything here (default: a temp dir, removed when the run passes)"
    )
    parser.add_argument(
        "--entry",
        choices=("retrylib", "spark-submit"),
        default="retrylib",
        help="start the job with `retrylib run` (default) or ./spark-submit.sh",
    )
    args = parser.parse_args(argv)
    sys.path.insert(0, str(HERE))
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="retrylib-faults-"))
    plan = plan_rounds(
        args.seed,
        rounds=args.rounds,
        points=args.points.split(",") if args.points else STEPS,
        random_kills=args.random_kills,
        broker_restarts=args.broker_restarts,
    )
    print(f"{len(plan)} rounds, seed {args.seed}, workdir {workdir}")
    started = time.monotonic()
    with FaultHarness(workdir, args.seed, wave_size=args.wave_size, entry=args.entry) as harness:
        report = harness.run(plan)
        spark = tests_session()
        try:
            harness.check(spark)
        except AssertionError as e:
            print(f"FAILED: {e}")
            return 1
        finally:
            spark.stop()
    print(report.summary())
    calls, needed = sum(report.calls.values()), harness.expected_calls()
    print(
        f"handler calls: {calls} for {report.inputs} inputs, {needed} needed: {calls - needed} "
        "made again by replays of batches that crashed before their manifest"
    )
    print(f"PASSED in {time.monotonic() - started:.0f}s")
    if not args.workdir:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
