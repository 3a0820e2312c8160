"""UnitProducer's produce-once logic on a scripted stand-in for the Kafka producer (no broker).

What the real broker adds (fencing, aborts, restarts) is in
tests/integration/test_crash_recovery.py.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Iterator

import pyarrow as pa
import pytest
from confluent_kafka import KafkaError, KafkaException

from retrylib.config.topic_names import produced_topic
from retrylib.errors import ProduceError, RetrylibError
from retrylib.sinks import transactional_producer
from retrylib.sinks.markers import read_marker
from retrylib.sinks.outgoing_records import OUTGOING_SCHEMA
from retrylib.sinks.transactional_producer import UnitProducer

JOB, APP, UNIT, KEY = "orders", "orders-0123456789ab", 2, b"k" * 32


class FakeProducer:
    """Records what a transactional producer is asked to do; `fail_at` scripts one failure."""

    def __init__(self, config: dict, script: dict) -> None:
        self.config = config
        self.calls: list[str] = []
        self.produced: list[tuple] = []
        self._pending: list = []
        self._fail_at = script.pop("fail_at", None)
        self._error = script.pop("error", None)

    def fail_next(self, step: str, error: KafkaError) -> None:
        self._fail_at, self._error = step, error

    def _step(self, name: str) -> None:
        self.calls.append(name)
        if name == self._fail_at:
            raise KafkaException(self._error)

    def list_topics(self, topic: str, timeout: float) -> None:
        self._step("metadata")

    def init_transactions(self, timeout: float) -> None:
        self._step("init")

    def begin_transaction(self) -> None:
        self._step("begin")

    def produce(self, topic, *, key, value, headers, partition, timestamp, on_delivery) -> None:
        self.produced.append((topic, partition, timestamp, key, value, headers))
        self._pending.append(on_delivery)

    def flush(self, timeout: float) -> int:
        self._step("flush")
        for callback in self._pending:
            callback(None, None)
        self._pending.clear()
        return 0

    def poll(self, timeout: float) -> int:
        return 0

    def commit_transaction(self, timeout: float) -> None:
        self._step("commit")

    def abort_transaction(self, timeout: float) -> None:
        self.calls.append("abort")

    def purge(self) -> None:
        self.calls.append("purge")


class Kafka:
    """Hands out FakeProducers (weakly held, so a test can see they are gone) and markers."""

    def __init__(self, scripts: list[dict] | None = None, marker: int | None = None) -> None:
        self.scripts = list(scripts or [])
        self.marker = marker
        self.producers: list[weakref.ref[FakeProducer]] = []
        self.live_at_init: list[int] = []
        self.marker_reads = 0
        self.on_make = lambda producer: None

    def make_producer(self, bootstrap: str, options: dict, **_) -> FakeProducer:
        # Every producer made before must be gone by the time a new one starts.
        self.live_at_init.append(sum(ref() is not None for ref in self.producers))
        producer = FakeProducer(dict(options), self.scripts.pop(0) if self.scripts else {})
        self.producers.append(weakref.ref(producer))
        self.on_make(producer)
        return producer

    def produced(self, batch_id: int) -> bool:
        self.marker_reads += 1
        return batch_id == self.marker


@pytest.fixture
def kafka(monkeypatch) -> Kafka:
    fake = Kafka()
    monkeypatch.setattr(transactional_producer, "make_producer", fake.make_producer)
    monkeypatch.setattr(
        UnitProducer, "produced", lambda _, batch_id, since: fake.produced(batch_id)
    )
    monkeypatch.setattr(transactional_producer.time, "sleep", lambda seconds: None)
    return fake


def rows(n: int, topic: str = "orders.retry.5s") -> list[dict]:
    return [
        {
            "topic": topic,
            "partition": i % 3,
            "timestamp_ms": 1_700_000_000_000 + i,
            "key": None if i == 0 else f"k{i}".encode(),
            "value": f"v{i}".encode(),
            "headers": [{"key": "retry.attempt", "value": b"1"}] if i % 2 else [],
        }
        for i in range(n)
    ]


class Records:
    """A `records` callable over `batches`; counts its calls."""

    def __init__(self, *batches: pa.RecordBatch) -> None:
        self.batches = batches
        self.calls = 0

    def __call__(self) -> Iterator[pa.RecordBatch]:
        self.calls += 1
        return iter(self.batches)


def records(n: int, per_batch: int = 2) -> Records:
    data = rows(n)
    return Records(
        *(
            pa.RecordBatch.from_pylist(data[i : i + per_batch], schema=OUTGOING_SCHEMA)
            for i in range(0, n, per_batch)
        )
    )


def producer(**kwargs) -> UnitProducer:
    return UnitProducer(
        JOB, APP, UNIT, "broker:9092", {"client.id": "x"}, signing_key=KEY, **kwargs
    )


def test_one_transaction_holds_the_records_then_the_marker(kafka):
    unit_producer = producer()
    assert unit_producer.produce_once(3, records(5), 0) == 5
    real = kafka.producers[0]()
    assert real.config["transactional.id"] == f"retrylib-{APP}-{UNIT}"
    assert real.config["client.id"] == "x"
    assert real.calls == ["metadata", "init", "begin", "flush", "commit"]
    *sent, marker = real.produced
    assert [(t, p, ts, k, v) for t, p, ts, k, v, _ in sent] == [
        (r["topic"], r["partition"], r["timestamp_ms"], r["key"], r["value"]) for r in rows(5)
    ]
    assert [h for *_, h in sent] == [[("retry.attempt", b"1")] if i % 2 else [] for i in range(5)]
    topic, partition, _, key, value, headers = marker
    assert (topic, partition, key) == (produced_topic(JOB), 0, APP.encode())
    assert read_marker(KEY, APP, key, value) == (3, UNIT)
    assert headers == []


def this_thread_sleeps(record):
    """A `time.sleep` for a test: `record` gets this thread's sleeps. The patch reaches every
    thread of the process (`time` is one module), and another test's thread left running
    (a client's poll loop) must still sleep, unrecorded."""
    sleep, test_thread = time.sleep, threading.get_ident()
    return lambda seconds: (
        record(seconds) if threading.get_ident() == test_thread else sleep(seconds)
    )


def test_the_transaction_begins_once_the_batch_may_produce(kafka, monkeypatch):
    # A delay router's records read ahead: the producer is made and the marker checked
    # first, so that they overlap the wait.
    now_s = 1_800_000_000.0
    calls: list[str] = []
    kafka.on_make = lambda made: setattr(made, "calls", calls)
    monkeypatch.setattr(UnitProducer, "produced", lambda *_: calls.append("marker") or False)
    monkeypatch.setattr(transactional_producer.time, "time", lambda: now_s)
    monkeypatch.setattr(
        transactional_producer.time, "sleep", this_thread_sleeps(lambda s: calls.append(f"{s} s"))
    )

    producer().produce_once(3, records(1), 0, not_before_ms=int(now_s * 1000) + 1_500)

    assert calls == ["metadata", "init", "marker", "1.5 s", "begin", "flush", "commit"]


def test_a_time_already_passed_is_not_waited_for(kafka, monkeypatch):
    waits: list[float] = []
    monkeypatch.setattr(transactional_producer.time, "sleep", this_thread_sleeps(waits.append))

    producer().produce_once(3, records(1), 0, not_before_ms=1_000)

    assert waits == []


def test_columns_are_taken_by_name(kafka):
    data = rows(3)
    shuffled = pa.schema([OUTGOING_SCHEMA.field(n) for n in reversed(OUTGOING_SCHEMA.names)])
    batch = pa.RecordBatch.from_pylist(data, schema=shuffled)
    unit_producer = producer()
    assert unit_producer.produce_once(0, Records(batch), 0) == 3
    sent = kafka.producers[0]().produced[:-1]
    assert [(t, k) for t, _, _, k, _, _ in sent] == [(r["topic"], r["key"]) for r in data]


def test_a_batch_whose_marker_is_there_is_skipped_without_reading_its_records(kafka):
    kafka.marker = 7
    unit_producer = producer()
    replayed = records(4)
    assert unit_producer.produce_once(7, replayed, 0) == 0
    assert replayed.calls == 0
    assert unit_producer.produce_once(8, records(2), 0) == 2
    assert unit_producer.produce_once(8, records(2), 0) == 0  # known since its own commit
    assert kafka.marker_reads == 1


def test_a_unit_that_committed_a_later_batch_refuses_an_older_one(kafka):
    unit_producer = producer()
    assert unit_producer.produce_once(7, records(1), 0) == 1
    behind = records(1)
    with pytest.raises(RetrylibError, match="committed batch 7, but .* running batch 6"):
        unit_producer.produce_once(6, behind, 0)
    assert behind.calls == 0


def test_a_failure_is_retried_on_a_new_producer_with_the_records_read_again(kafka):
    error = KafkaError(KafkaError._TIMED_OUT, "flush timed out")
    kafka.scripts = [{"fail_at": "commit", "error": error}, {"fail_at": "init", "error": error}]
    unit_producer = producer()
    again = records(3)
    assert unit_producer.produce_once(0, again, 0) == 3
    assert again.calls == 2
    assert kafka.marker_reads == 2  # checked again once a new producer was initialised
    assert kafka.live_at_init == [0, 0, 0]  # each discarded producer was gone before the next
    assert len(kafka.producers) == 3
    assert all(ref() is None for ref in kafka.producers[:2])
    assert kafka.producers[2]().calls == ["metadata", "init", "begin", "flush", "commit"]


def test_the_failed_transaction_is_aborted_and_its_producer_purged(kafka):
    kafka.scripts = [{"fail_at": "flush", "error": KafkaError(KafkaError._MSG_TIMED_OUT)}]
    calls = []
    kafka.on_make = lambda made: calls.append(made.calls)  # the list outlives the producer
    assert producer().produce_once(0, records(1), 0) == 1
    assert calls[0] == ["metadata", "init", "begin", "flush", "abort", "purge"]


@pytest.mark.parametrize(
    "code", [KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH]
)
def test_a_producer_made_for_the_call_being_fenced_is_not_retried(kafka, code):
    kafka.scripts = [{"fail_at": "commit", "error": KafkaError(code)}]
    unit_producer = producer()
    once = records(2)
    with pytest.raises(ProduceError, match="fenced .*another attempt of the same work"):
        unit_producer.produce_once(0, once, 0)
    assert once.calls == 1
    assert len(kafka.producers) == 1


def test_a_kept_producer_found_fenced_is_replaced_at_once(kafka):
    # Another worker took the unit's id since this producer's last batch: its next
    # transaction is fenced, and a new producer checks the marker and produces.
    unit_producer = producer(retry_seconds=0)
    assert unit_producer.produce_once(0, records(1), 0) == 1
    kafka.producers[0]().fail_next("commit", KafkaError(KafkaError.PRODUCER_FENCED))
    again = records(2)
    assert unit_producer.produce_once(1, again, 0) == 2
    assert again.calls == 2
    assert len(kafka.producers) == 2
    assert kafka.marker_reads == 2


def test_retrying_stops_after_retry_seconds(kafka):
    error = KafkaError(KafkaError._TRANSPORT, "broker down")
    kafka.scripts = [{"fail_at": "commit", "error": error}]
    unit_producer = producer(retry_seconds=0)
    with pytest.raises(ProduceError, match=r"failed 1 time\(s\) over 0s; last error: .*down"):
        unit_producer.produce_once(0, records(2), 0)


def test_a_missing_column_fails_the_batch_without_retrying(kafka):
    batch = pa.RecordBatch.from_pylist(rows(1)).drop_columns(["timestamp_ms"])
    unit_producer = producer()
    with pytest.raises(RetrylibError, match=r"batch 2 lack column\(s\) \['timestamp_ms'\]"):
        unit_producer.produce_once(2, Records(batch), 0)
    assert len(kafka.producers) == 1  # not retried
    assert kafka.producers[0]() is None  # but discarded: the next batch starts afresh
    assert unit_producer.produce_once(2, records(1), 0) == 1


def test_an_error_from_records_is_raised_as_it_is_and_the_transaction_aborted(kafka):
    def broken() -> Iterator[pa.RecordBatch]:
        yield pa.RecordBatch.from_pylist(rows(2), schema=OUTGOING_SCHEMA)
        raise OSError("the driver lost its executors")

    calls = []
    kafka.on_make = lambda made: calls.append(made.calls)
    with pytest.raises(OSError, match="lost its executors"):
        producer().produce_once(0, broken, 0)
    assert calls[0] == ["metadata", "init", "begin", "abort", "purge"]
    assert kafka.producers[0]() is None


def test_a_discarded_producer_is_gone_even_while_its_error_is_kept(kafka):
    # The error that ends produce_once holds (through its traceback) the frames that used the
    # producer; the next batch's new producer must still be the only one alive.
    kafka.scripts = [{"fail_at": "commit", "error": KafkaError(KafkaError._TRANSPORT)}]
    unit_producer = producer(retry_seconds=0)
    with pytest.raises(ProduceError) as kept:
        unit_producer.produce_once(0, records(1), 0)
    assert unit_producer.produce_once(0, records(1), 0) == 1
    assert isinstance(kept.value.__cause__, KafkaException)
    assert kafka.live_at_init == [0, 0]
