"""Exactly-once effects across crashes: crash points, produce-once, and the fault harness.

The harness test runs the real job as a subprocess, kills it at every crash point and at
random moments, restarts the broker under it, and checks the tables and topics with chispa
(see tests/faults/harness.py; run it by hand with --rounds N --seed S for a soak).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from confluent_kafka import KafkaError, TopicPartition

from retrylib.errors import RetrylibError
from retrylib.faults import CRASH_POINTS
from retrylib.kafka_client import ensure_topics, make_admin, make_consumer, make_producer
from retrylib.router import checkpoint_identity, claim_json
from retrylib.staging import STAGED_SCHEMA, ProduceError, StagedProducer, control_topic

FAULTS_DIR = Path(__file__).resolve().parents[1] / "faults"
REPO = FAULTS_DIR.parents[1]
sys.path.insert(0, str(FAULTS_DIR))

from harness import FaultHarness, plan_rounds  # noqa: E402

SEED = 20261123


# -- crash points -------------------------------------------------------------------------


def _python(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("RETRYLIB_CRASH")}
    return subprocess.run(
        [sys.executable, "-c", code],
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )


CALL_POINT = (
    "from retrylib.faults import crash_point\n"
    "for batch in range(3):\n"
    "    crash_point('after_produce', batch)\n"
    "    print('passed', batch, flush=True)\n"
)


def test_crash_points_are_off_unless_asked():
    assert _python(CALL_POINT).stdout.split("\n")[:3] == ["passed 0", "passed 1", "passed 2"]
    other = _python(CALL_POINT, RETRYLIB_CRASH_AT="after_manifest")
    assert other.returncode == 0 and "passed 2" in other.stdout


def test_crash_point_kills_at_the_named_batch_and_hit():
    by_batch = _python(CALL_POINT, RETRYLIB_CRASH_AT="after_produce", RETRYLIB_CRASH_BATCH="1")
    assert by_batch.returncode == -9
    assert by_batch.stdout.split() == ["passed", "0"]
    assert "crash at after_produce in batch 1" in by_batch.stderr
    skipped = _python(CALL_POINT, RETRYLIB_CRASH_AT="after_produce", RETRYLIB_CRASH_SKIP="2")
    assert skipped.returncode == -9 and skipped.stdout.split() == ["passed", "0", "passed", "1"]


def test_a_misspelt_crash_point_fails_at_import():
    typo = _python(CALL_POINT, RETRYLIB_CRASH_AT="after_prodcue")
    assert typo.returncode == 1
    assert "RETRYLIB_CRASH_AT='after_prodcue' is not a crash point" in typo.stderr


def test_every_crash_point_is_placed_once():
    source = (REPO / "retrylib" / "router.py").read_text()
    source += (REPO / "retrylib" / "staging.py").read_text()
    assert sorted(re.findall(r'crash_point\("(\w+)"', source)) == sorted(CRASH_POINTS)


# -- the manifest -------------------------------------------------------------------------


def test_the_first_manifest_wins(tmp_path):
    uri = str(tmp_path / "manifests" / "7.json")
    first = {"now_ms": 1, "files": {"output": ["a"]}, "counters": {}}
    second = {"now_ms": 2, "files": {"output": ["b"]}, "counters": {}}
    assert claim_json(uri, first) is first
    assert claim_json(uri, second) == first  # the replay adopts the first decisions
    assert os.listdir(tmp_path / "manifests") == ["7.json"]  # no temporary files left


def test_the_checkpoint_identity_is_created_once(tmp_path):
    app_id = checkpoint_identity(str(tmp_path), "orders")
    assert re.fullmatch(r"orders-[0-9a-f]{12}", app_id)
    assert checkpoint_identity(str(tmp_path), "orders") == app_id


# -- producing once -----------------------------------------------------------------------


def _staged(tmp_path: Path, name: str, topic: str, count: int) -> str:
    rows = [
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
    path = tmp_path / f"{name}.parquet"
    pq.write_table(pa.Table.from_pylist(rows, schema=STAGED_SCHEMA), path)
    return str(path)


def _committed_values(bootstrap: str, topic: str, start: int = 0) -> list[bytes]:
    """The values of `topic`'s committed records, each partition read from offset `start`."""
    consumer = make_consumer(
        bootstrap, {"isolation.level": "read_committed", "enable.partition.eof": True}
    )
    partitions = sorted(consumer.list_topics(topic, timeout=10).topics[topic].partitions)
    consumer.assign([TopicPartition(topic, p, start) for p in partitions])
    values, open_partitions = [], set(partitions)
    deadline = time.monotonic() + 30
    while open_partitions and time.monotonic() < deadline:
        message = consumer.poll(1.0)
        if message is None:
            continue
        if message.error() is not None:
            assert message.error().code() == KafkaError._PARTITION_EOF, message.error()
            open_partitions.discard(message.partition())
            continue
        values.append(message.value())
    consumer.close()
    assert not open_partitions
    return values


@pytest.fixture
def topics(bootstrap_servers, make_topic):
    job = f"job{time.monotonic_ns()}"
    ensure_topics(make_admin(bootstrap_servers, {}), {control_topic(job): 1}, create=True)
    return job, make_topic("tier", partitions=2)


@pytest.mark.slow
def test_the_marker_is_found_behind_aborted_transactions(tmp_path, bootstrap_servers, topics):
    job, tier = topics
    producer = StagedProducer(job, "app-1", bootstrap_servers, {}, state_dir=str(tmp_path))
    assert producer.last_produced_batch() is None
    assert producer.produce_once(0, [_staged(tmp_path, "b0", tier, 4)]) == 4
    # Many aborted transactions carrying our key, then markers of another checkpoint: the
    # backward scan must find batch 0 behind all of them.
    other = make_producer(bootstrap_servers, {"transactional.id": f"{job}-other"})
    other.init_transactions(30)
    for batch in range(1, 120):
        other.begin_transaction()
        other.produce(control_topic(job), key=b"app-1", value=str(batch).encode(), partition=0)
        other.flush(10)
        other.abort_transaction(30)
    plain = make_producer(bootstrap_servers, {})
    for batch in range(300):
        plain.produce(control_topic(job), key=b"app-0", value=str(batch).encode(), partition=0)
    plain.flush(10)
    assert producer.last_produced_batch() == 0

    assert producer.produce_once(1, [_staged(tmp_path, "b1", tier, 3)]) == 3
    assert producer.produce_once(1, [_staged(tmp_path, "b1", tier, 3)]) == 0  # replay
    again = StagedProducer(job, "app-1", bootstrap_servers, {}, state_dir=str(tmp_path))
    assert again.produce_once(1, ["/gone/because/cleaned/up.parquet"]) == 0  # replay, restarted
    with pytest.raises(RetrylibError, match="holds the marker of batch 1"):
        again.produce_once(0, [_staged(tmp_path, "b0", tier, 4)])  # an older checkpoint
    again.close()
    assert sorted(_committed_values(bootstrap_servers, tier)) == [b"b0"] * 4 + [b"b1"] * 3


@pytest.mark.slow
def test_a_crash_inside_the_transaction_then_replay_produces_once(
    tmp_path, bootstrap_servers, topics
):
    job, tier = topics
    path = _staged(tmp_path, "b5", tier, 6)
    crashed = _python(
        "from retrylib.staging import StagedProducer\n"
        f"p = StagedProducer({job!r}, 'app-1', {bootstrap_servers!r}, {{}}, "
        f"state_dir={str(tmp_path)!r})\n"
        f"p.produce_once(5, [{path!r}])\n",
        RETRYLIB_CRASH_AT="in_produce",
    )
    assert crashed.returncode == -9, crashed.stderr
    replay = StagedProducer(job, "app-1", bootstrap_servers, {}, state_dir=str(tmp_path))
    assert replay.last_produced_batch() is None  # the open transaction was aborted
    assert replay.produce_once(5, [path]) == 6
    assert replay.produce_once(6, [_staged(tmp_path, "b6", tier, 2)]) == 2
    replay.close()
    assert sorted(_committed_values(bootstrap_servers, tier)) == [b"b5"] * 6 + [b"b6"] * 2
    # Each partition holds 3 aborted records and the abort marker at offsets 0-3. A read that
    # starts behind them still sees what came after (noida-db hides later records of the
    # producer of an aborted transaction from such a read: hence a new transactional id).
    assert sorted(_committed_values(bootstrap_servers, tier, 4)) == [b"b5"] * 6 + [b"b6"] * 2
    assert (tmp_path / "producer.json").read_text() == '{"generation": 1}'


@pytest.mark.slow
def test_a_fenced_instance_stops_instead_of_fencing_back(tmp_path, bootstrap_servers, topics):
    job, tier = topics
    old = StagedProducer(job, "app-1", bootstrap_servers, {}, state_dir=str(tmp_path))
    new = StagedProducer(job, "app-1", bootstrap_servers, {}, state_dir=str(tmp_path))
    with pytest.raises(ProduceError, match="another instance"):
        old.produce_once(0, [_staged(tmp_path, "zombie", tier, 2)])
    assert new.produce_once(0, [_staged(tmp_path, "live", tier, 2)]) == 2
    new.close()
    assert _committed_values(bootstrap_servers, tier) == [b"live", b"live"]


@pytest.mark.slow
def test_a_transaction_split_by_a_broker_restart_is_redone_whole(tmp_path, monkeypatch):
    """noida-db aborts what a transaction sent before it restarted, then commits the rest:
    the producer must notice before committing and redo the whole batch."""
    from retrylib.broker import EmbeddedBroker

    with EmbeddedBroker(data_dir=tmp_path / "broker") as broker:
        bootstrap = broker.bootstrap_servers
        ensure_topics(make_admin(bootstrap, {}), {control_topic("j"): 1, "tier": 2}, create=True)
        producer = StagedProducer("j", "app", bootstrap, {}, state_dir=str(tmp_path / "state"))
        assert producer.produce_once(0, [_staged(tmp_path, "b0", "tier", 2)]) == 2
        original = producer._produce_file
        restarted = []

        def restart_after_sending(kafka_producer, path, deliveries):
            count = original(kafka_producer, path, deliveries)
            if not restarted:
                kafka_producer.flush(10)
                broker.stop()
                broker.start()
                restarted.append(True)
            return count

        monkeypatch.setattr(producer, "_produce_file", restart_after_sending)
        assert producer.produce_once(1, [_staged(tmp_path, "b1", "tier", 4)]) == 4
        producer.close()
        assert restarted
        assert sorted(_committed_values(bootstrap, "tier")) == [b"b0"] * 2 + [b"b1"] * 4
        assert sorted(_committed_values(bootstrap, control_topic("j"))) == [b"0", b"1"]


# -- the real job, killed over and over ---------------------------------------------------


@pytest.mark.slow
def test_exactly_once_across_crashes_and_a_broker_restart(tmp_path, request):
    plan = plan_rounds(SEED, random_kills=3, broker_restarts=1)
    with FaultHarness(tmp_path, SEED, say=lambda line: print(line, flush=True)) as harness:
        report = harness.run(plan)
        summary = f"{report.summary()}\n\n{harness.log_tails()}"
        for outcome in report.outcomes:
            if outcome.round.kind == "point":
                assert outcome.crashed_at == outcome.round.point, summary
            if outcome.round.kind in ("point", "random"):
                assert outcome.returncode == -9, f"round {outcome.index} died:\n{summary}"
        harness.check(request.getfixturevalue("spark"))
    print(report.summary())
