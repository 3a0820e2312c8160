"""Exactly-once effects across crashes: the crash listener, produce-once, and the fault harness.

The harness test runs the real job as a subprocess, kills it at every step of a batch and at
random moments, restarts the broker under it, and checks the tables and topics with chispa
(see tests/faults/harness.py; run it by hand with --rounds N --seed S for a soak).
"""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest
from helpers import read_topic, wait_for

from retrylib.config.topic_names import produced_topic
from retrylib.errors import ProduceError
from retrylib.kafka.clients import ensure_topics, make_admin, make_producer
from retrylib.sinks import transactional_producer
from retrylib.sinks.markers import ControlTopic, read_marker
from retrylib.sinks.outgoing_records import OUTGOING_SCHEMA
from retrylib.sinks.transactional_producer import UnitProducer
from retrylib.state.checkpoint import Checkpoint
from retrylib.state.files import claim_json, read_json

FAULTS_DIR = Path(__file__).resolve().parents[1] / "faults"
REPO = FAULTS_DIR.parents[1]
sys.path.insert(0, str(FAULTS_DIR))

from faults.crash.crash_points import crash_env  # noqa: E402
from harness import FaultHarness, plan_rounds  # noqa: E402

SEED = 20261123
KEY = b"k" * 32  # a checkpoint's signing key


# -- the crash listener -------------------------------------------------------------------


def _python(code: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )


CALL_POINT = (
    "from retrylib.steps import reached\n"
    "for batch in range(3):\n"
    "    reached('after_produce', batch)\n"
    "    print('passed', batch, flush=True)\n"
)


@pytest.mark.every_spark
def test_crash_points_are_off_unless_asked():
    assert _python(CALL_POINT).stdout.split("\n")[:3] == ["passed 0", "passed 1", "passed 2"]
    other = _python(CALL_POINT, crash_env("after_manifest"))
    assert other.returncode == 0 and "passed 2" in other.stdout


@pytest.mark.every_spark
def test_crash_point_kills_at_the_named_batch_and_hit():
    by_batch = _python(CALL_POINT, crash_env("after_produce", batch=1))
    assert by_batch.returncode == -9
    assert by_batch.stdout.split() == ["passed", "0"]
    assert "crash at after_produce in batch 1" in by_batch.stderr
    skipped = _python(CALL_POINT, crash_env("after_produce", skip=2))
    assert skipped.returncode == -9 and skipped.stdout.split() == ["passed", "0", "passed", "1"]


@pytest.mark.every_spark
def test_a_misspelt_crash_point_fails_the_process_at_its_start():
    typo = _python(CALL_POINT, crash_env("after_prodcue"))
    assert typo.returncode == 1 and "passed" not in typo.stdout
    assert "RETRYLIB_CRASH_AT='after_prodcue' is not a step" in typo.stderr


# -- the manifest -------------------------------------------------------------------------


@pytest.mark.every_spark
@pytest.mark.parametrize("scheme", ["", "file:"])
def test_the_first_manifest_wins(spark, tmp_path, scheme):
    """A plain path is claimed with a hard link; a URI through Hadoop's FileSystem."""
    uri = f"{scheme}{tmp_path}/manifests/7.json"
    first = {"now_ms": 1, "rows": {"output": 1}, "counters": {}}
    second = {"now_ms": 2, "rows": {"output": 2}, "counters": {}}
    assert claim_json(spark, uri, first) is first
    assert claim_json(spark, uri, second) == first  # the replay adopts the first decisions
    assert read_json(spark, uri) == first
    left = [name for name in os.listdir(tmp_path / "manifests") if not name.endswith(".crc")]
    assert left == ["7.json"]  # no temporary files left


@pytest.mark.every_spark
@pytest.mark.parametrize("scheme", ["", "file:"])
def test_a_checkpoint_s_app_id_is_created_once(spark, tmp_path, scheme):
    app_id = Checkpoint(f"{scheme}{tmp_path}").app_id(spark, "orders")
    assert re.fullmatch(r"orders-[0-9a-f]{12}", app_id)
    assert Checkpoint(f"{scheme}{tmp_path}").app_id(spark, "orders") == app_id
    assert Checkpoint(str(tmp_path)).app_id(spark, "orders") == app_id


# -- producing once -----------------------------------------------------------------------


def _rows(name: str, topic: str, count: int) -> list[dict]:
    """`count` outgoing records of value `name` over `topic`'s partitions 0 and 1."""
    return [
        {
            "topic": topic,
            "partition": i % 2,
            "timestamp_ms": int(time.time() * 1000),
            "key": f"{name}-{i}".encode(),
            "value": name.encode(),
            "headers": [{"key": "h", "value": b"1"}],
        }
        for i in range(count)
    ]


class Outgoing:
    """A `records` callable for `UnitProducer.produce_once`: `_rows(name, topic, count)` in
    RecordBatches of two rows. `midway(call)`, if given, runs after the first RecordBatch was
    taken, on each call (1, 2, ...); `calls` counts the calls."""

    def __init__(self, name: str, topic: str, count: int, midway=None) -> None:
        self.rows = _rows(name, topic, count)
        self.batches = [
            pa.RecordBatch.from_pylist(self.rows[i : i + 2], schema=OUTGOING_SCHEMA)
            for i in range(0, count, 2)
        ]
        self.midway = midway
        self.calls = 0

    def __call__(self) -> Iterator[pa.RecordBatch]:
        self.calls += 1
        return self._batches(self.calls)

    def _batches(self, call: int) -> Iterator[pa.RecordBatch]:
        for index, batch in enumerate(self.batches):
            if index == 1 and self.midway is not None:
                self.midway(call)
            yield batch


Seen = list[tuple[bytes | None, bytes | None]]


def _once(*outgoing: Outgoing) -> Seen:
    """What `_read` returns when each record of `outgoing` is in the topic once."""
    return sorted((row["key"], row["value"]) for s in outgoing for row in s.rows)


def _read(bootstrap: str, topic: str, isolation: str = "read_committed") -> Seen:
    """(key, value) of every record of `topic` that a reader with `isolation` sees, sorted."""
    return sorted((m.key(), m.value()) for m in read_topic(bootstrap, topic, isolation=isolation))


def _wait_committed(bootstrap: str, records: list, markers: list[tuple[int, int]]) -> None:
    """Wait (30 s at most) until job "j" app "app" has exactly `records` in the tier and
    `markers` in its control topic, both read committed. A commit returns once the
    transaction coordinator has logged it; the markers that show its records to
    read_committed readers are written after it, seconds after a broker restart."""
    wait_for(lambda: _read(bootstrap, "tier") == records, 30, f"records {records}")
    wait_for(lambda: _markers(bootstrap, "j", "app") == markers, 30, f"markers {markers}")


def _markers(bootstrap: str, job: str, app: str = "app-1") -> list[tuple[int, int]]:
    """(batch, unit) of the committed markers of app id `app` in the control topic."""
    found = [
        read_marker(KEY, app, m.key(), m.value())
        for m in read_topic(bootstrap, produced_topic(job), isolation="read_committed")
    ]
    return sorted(marker for marker in found if marker is not None)


def _unit(job: str, unit: int = 0, app: str = "app-1", bootstrap: str = "") -> UnitProducer:
    return UnitProducer(job, app, unit, bootstrap, {}, signing_key=KEY)


@pytest.fixture
def topics(bootstrap_servers, make_topic):
    """A fresh job name with its control topic, and a fresh two-partition tier topic."""
    job = f"job{time.monotonic_ns()}"
    ensure_topics(make_admin(bootstrap_servers, {}), {produced_topic(job): 1}, create=True)
    return job, make_topic("tier", partitions=2)


@pytest.mark.every_spark
def test_a_replay_after_the_commit_produces_nothing(bootstrap_servers, topics):
    job, tier = topics
    producer = _unit(job, bootstrap=bootstrap_servers)
    assert producer.transactional_id == "retrylib-app-1-0"
    b0 = Outgoing("b0", tier, 4)
    assert producer.produce_once(0, b0, 0) == 4
    # Many aborted transactions carrying our key, then plain records that look like markers
    # of this and another checkpoint (what a forwarded record could plant): the backward scan
    # must find batch 0 behind all of them and believe none of them.
    other = make_producer(bootstrap_servers, {"transactional.id": f"{job}-other"})
    other.init_transactions(30)
    for batch in range(1, 120):
        other.begin_transaction()
        other.produce(produced_topic(job), key=b"app-1", value=f"{batch}:0:x".encode(), partition=0)
        other.flush(10)
        other.abort_transaction(30)
    plain = make_producer(bootstrap_servers, {})
    for batch in range(300):
        plain.produce(produced_topic(job), key=b"app-0", value=str(batch).encode(), partition=0)
    plain.produce(produced_topic(job), key=b"app-1", value=b"1000000", partition=0)
    plain.produce(produced_topic(job), key=b"app-1", value=b"1:0:" + b"0" * 32, partition=0)
    plain.flush(10)
    control = ControlTopic(
        bootstrap_servers, {}, produced_topic(job), signing_key=KEY, app_id="app-1"
    )
    assert control.last_produced_batch() == 0

    since = control.end_offset()
    b1 = Outgoing("b1", tier, 3)
    assert producer.produce_once(1, b1, since) == 3
    assert producer.produce_once(1, b1, since) == 0  # replay in the same worker
    restarted = _unit(job, bootstrap=bootstrap_servers)  # a crash after the commit
    assert restarted.produce_once(1, b1, since) == 0
    assert b1.calls == 1
    assert control.last_produced_batch() == 1
    restarted.close()
    assert _read(bootstrap_servers, tier) == _once(b0, b1)


def _produce_and_crash(
    bootstrap: str, job: str, outgoing: Outgoing, batch_id: int, point: str
) -> subprocess.CompletedProcess[str]:
    """Unit 0 of app id "app-1" produces `outgoing`'s rows as batch `batch_id` in a process
    of its own, which crash point `point` kills."""
    return _python(
        "import pyarrow as pa\n"
        "from retrylib.sinks.outgoing_records import OUTGOING_SCHEMA\n"
        "from retrylib.sinks.transactional_producer import UnitProducer\n"
        f"rows = {outgoing.rows!r}\n"
        f"p = UnitProducer({job!r}, 'app-1', 0, {bootstrap!r}, {{}}, signing_key={KEY!r})\n"
        f"p.produce_once({batch_id}, "
        "lambda: [pa.RecordBatch.from_pylist(rows, schema=OUTGOING_SCHEMA)], 0)\n",
        crash_env(point),
    )


@pytest.mark.every_spark
def test_a_crash_before_the_commit_then_replay_produces_once(bootstrap_servers, topics):
    job, tier = topics
    crashed = _produce_and_crash(bootstrap_servers, job, Outgoing("b5", tier, 6), 5, "in_produce")
    assert crashed.returncode == -9, crashed.stderr
    assert "crash at in_produce in batch 5" in crashed.stderr
    replay = _unit(job, bootstrap=bootstrap_servers)  # aborts the open transaction
    b5, b6 = Outgoing("b5", tier, 6), Outgoing("b6", tier, 2)
    assert replay.produce_once(5, b5, 0) == 6
    assert replay.produce_once(6, b6, 0) == 2
    replay.close()
    assert _read(bootstrap_servers, tier) == _once(b5, b6)
    # The crashed run's records did reach the log, in the transaction that was aborted.
    assert _read(bootstrap_servers, tier, "read_uncommitted") == _once(b5, b5, b6)
    assert _markers(bootstrap_servers, job) == [(5, 0), (6, 0)]


@pytest.mark.every_spark
def test_a_crash_after_the_commit_then_replay_produces_nothing(bootstrap_servers, topics):
    job, tier = topics
    other_unit = _unit(job, unit=1, bootstrap=bootstrap_servers)
    b3_of_1 = Outgoing("b3u1", tier, 2)
    assert other_unit.produce_once(3, b3_of_1, 0) == 2
    crashed = _produce_and_crash(
        bootstrap_servers, job, Outgoing("b3", tier, 4), 3, "after_unit_commit"
    )
    assert crashed.returncode == -9, crashed.stderr
    replay = _unit(job, bootstrap=bootstrap_servers)  # a new attempt of unit 0
    b3 = Outgoing("b3", tier, 4)
    assert replay.produce_once(3, b3, 0) == 0
    assert b3.calls == 0
    replay.close()
    other_unit.close()
    assert _read(bootstrap_servers, tier) == _once(b3, b3_of_1)
    assert _markers(bootstrap_servers, job) == [(3, 0), (3, 1)]


@pytest.mark.every_spark
def test_a_zombie_fenced_inside_its_transaction_commits_nothing(bootstrap_servers, topics):
    job, tier = topics
    old = _unit(job, bootstrap=bootstrap_servers)
    new = _unit(job, bootstrap=bootstrap_servers)
    live = Outgoing("live", tier, 4)
    done: list[int] = []

    def new_attempt_runs(call: int) -> None:  # Spark ran the task again meanwhile
        done.append(new.produce_once(0, live, 0))

    zombie = Outgoing("zombie", tier, 6, midway=new_attempt_runs)
    with pytest.raises(ProduceError, match="fenced"):
        old.produce_once(0, zombie, 0)
    assert zombie.calls == 1  # not retried
    assert done == [4]
    new.close()
    assert _read(bootstrap_servers, tier) == _once(live)
    assert _markers(bootstrap_servers, job) == [(0, 0)]


@pytest.mark.every_spark
def test_a_kept_producer_taken_over_by_another_worker_produces_once(bootstrap_servers, topics):
    job, tier = topics
    first, second = _unit(job, bootstrap=bootstrap_servers), _unit(job, bootstrap=bootstrap_servers)
    b0, b1, b2 = Outgoing("b0", tier, 2), Outgoing("b1", tier, 2), Outgoing("b2", tier, 2)
    assert first.produce_once(0, b0, 0) == 2
    assert second.produce_once(1, b1, 0) == 2  # the unit moved: fences the first's producer
    assert first.produce_once(2, b2, 0) == 2  # and back: the kept producer is replaced
    assert b2.calls == 2
    first.close()
    second.close()
    assert _read(bootstrap_servers, tier) == _once(b0, b1, b2)
    assert _markers(bootstrap_servers, job) == [(0, 0), (1, 0), (2, 0)]


@pytest.fixture
def own_broker(tmp_path):
    """A broker of this test's own, to restart; its data under tmp_path."""
    from retrylib.dev.broker import EmbeddedBroker

    with EmbeddedBroker(data_dir=tmp_path / "broker") as broker:
        ensure_topics(
            make_admin(broker.bootstrap_servers, {}),
            {produced_topic("j"): 1, "tier": 2},
            create=True,
        )
        yield broker


def test_broker_restarts_between_batches_and_inside_a_transaction(own_broker):
    bootstrap = own_broker.bootstrap_servers
    producer = _unit("j", app="app", bootstrap=bootstrap)
    b0, b1 = Outgoing("b0", "tier", 2), Outgoing("b1", "tier", 4)
    assert producer.produce_once(0, b0, 0) == 2
    own_broker.stop()
    own_broker.start()
    assert producer.produce_once(1, b1, 0) == 4
    assert producer.produce_once(1, b1, 0) == 0

    def restart(call: int) -> None:
        if call == 1:
            own_broker.stop()
            own_broker.start()

    # The broker keeps the open transaction across a clean restart: it commits, or fails
    # and is produced whole once more.
    b2 = Outgoing("b2", "tier", 6, midway=restart)
    assert producer.produce_once(2, b2, 0) == 6
    producer.close()
    _wait_committed(bootstrap, _once(b0, b1, b2), [(0, 0), (1, 0), (2, 0)])


def test_a_broker_down_longer_than_the_timeouts_is_retried_until_it_is_back(
    own_broker, monkeypatch, caplog
):
    bootstrap = own_broker.bootstrap_servers
    producer = _unit("j", app="app", bootstrap=bootstrap)
    b0 = Outgoing("b0", "tier", 2)
    assert producer.produce_once(0, b0, 0) == 2
    # Each Kafka call gives up after 3 s, so the batch's transaction fails, and so do the
    # new producers' init_transactions, until the broker is back some 8 s later.
    for name in ("_INIT_TIMEOUT_S", "_COMMIT_TIMEOUT_S", "_ABORT_TIMEOUT_S"):
        monkeypatch.setattr(transactional_producer, name, 3.0)
    outage: list[threading.Thread] = []
    restart_errors: list[BaseException] = []

    def start_again() -> None:
        time.sleep(8)
        try:
            own_broker.start()
        except BaseException as e:
            restart_errors.append(e)

    def crash_broker(call: int) -> None:
        if call == 1:
            own_broker.kill()
            outage.append(threading.Thread(target=start_again))
            outage[0].start()

    b1 = Outgoing("b1", "tier", 6, midway=crash_broker)
    with caplog.at_level(logging.WARNING, logger=transactional_producer.__name__):
        assert producer.produce_once(1, b1, 0) == 6
    outage[0].join()
    assert not restart_errors
    retries = [r for r in caplog.records if "retrying" in r.getMessage()]
    assert len(retries) >= 2, [r.getMessage() for r in caplog.records]
    assert b1.calls >= 2  # read again once the broker answered
    producer.close()
    _wait_committed(bootstrap, _once(b0, b1), [(0, 0), (1, 0)])


# -- the real job, killed over and over ---------------------------------------------------
@pytest.mark.every_spark
def test_a_python_worker_lost_after_its_units_commit_is_run_again_once(tmp_path, request):
    """An executor's Python worker dies right after its unit's transaction committed, before
    its task returns: Spark runs the task again (local[2,3] lets a task fail), the new
    attempt finds the unit's marker, and every record lands once. (A worker lost inside the
    transaction is the harness's in_produce point: the next attempt aborts it.) The job reads
    with Spark's connector here: the every-point test below runs the default reader."""
    point = "after_unit_commit"
    with FaultHarness(
        tmp_path, SEED + 1, master="local[2,3]", source="builtin", say=print
    ) as harness:
        harness.produce_wave()
        once = tmp_path / "crashed-once"
        outcome = harness.drain(env=crash_env(point, once=once))
        text = outcome.log.read_text(errors="replace")
        assert once.exists() and f"crash at {point} in batch" in text, harness.log_tails()
        assert outcome.returncode == 0, harness.log_tails()
        harness.check(request.getfixturevalue("spark"))


def test_exactly_once_across_a_crash_at_every_point(tmp_path, request):
    """Through spark-submit.sh, as users start the job: a crash at each step of the first
    start (inside each table's creation too), then at each step of a batch."""
    plan = plan_rounds(SEED, random_kills=0, broker_restarts=0)
    # Random kills and broker restarts are the by-hand soak's (`harness.py --rounds 40`); the
    # broker restarts have tests of their own above.
    with FaultHarness(
        tmp_path, SEED, entry="spark-submit", say=lambda line: print(line, flush=True)
    ) as harness:
        report = harness.run(plan)
        summary = f"{report.summary()}\n\n{harness.log_tails()}"
        for outcome in report.outcomes:
            if outcome.round.kind == "point":
                assert outcome.crashed_at == outcome.round.point, summary
            if outcome.round.kind in ("point", "random"):
                assert outcome.returncode == -9, f"round {outcome.index} died:\n{summary}"
        harness.check(request.getfixturevalue("spark"))
    print(report.summary())
