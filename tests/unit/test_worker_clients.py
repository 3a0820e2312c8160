"""The Kafka clients a Python worker keeps (`worker_clients`), and the readers and tasks that
use them, on a fake consumer: no Spark, no sockets."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace

import pyarrow as pa
import pytest
from confluent_kafka import KafkaError
from pyspark.sql.pandas.types import to_arrow_schema

from retrylib.errors import KafkaSourceError
from retrylib.kafka import worker_clients
from retrylib.kafka.arrow_records import RANGE_SCHEMA
from retrylib.kafka.worker_clients import Pool, kept_consumer
from retrylib.source import range_reader
from retrylib.source.range_reader import KafkaInputPartition, read_messages
from retrylib.task.forwarding import run_forwarding_task
from retrylib.task.routing import run_task


class Client:
    """A client the pool keeps: it only knows whether it was closed."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.closed = False

    def close(self) -> None:
        self.closed = True


def pool(limit: int) -> Pool[Client]:
    return Pool(limit, Client.close)


def test_a_client_given_back_is_taken_again_and_made_only_once() -> None:
    clients = pool(2)
    made: list[Client] = []

    def make() -> Client:
        made.append(Client("a"))
        return made[-1]

    first = clients.take("a", make)
    clients.give("a", first)
    assert clients.take("a", make) is first
    assert made == [first] and not first.closed


def test_past_its_limit_the_pool_closes_the_least_recently_given_client() -> None:
    clients = pool(2)
    a, b, c = Client("a"), Client("b"), Client("c")
    clients.give("a", a)
    clients.give("b", b)
    clients.give("a", clients.take("a", lambda: Client("new a")))  # a is the most recent now

    clients.give("c", c)

    assert b.closed and not a.closed and not c.closed
    assert clients.take("a", lambda: Client("new a")) is a
    assert clients.take("b", lambda: Client("new b")).name == "new b"


def test_a_taken_client_is_out_of_the_pool_and_never_closed_by_it() -> None:
    clients = pool(1)
    busy = clients.take("a", lambda: Client("a"))
    clients.give("b", Client("b"))
    clients.give("c", Client("c"))
    assert not busy.closed  # only what is in the pool counts against its limit


def test_a_second_client_given_under_one_key_closes_the_first() -> None:
    clients = pool(4)
    old, new = Client("old"), Client("new")
    clients.give("a", old)
    clients.give("a", new)
    assert old.closed and not new.closed
    assert clients.take("a", lambda: Client("made")) is new


def test_clear_closes_every_client_even_when_a_close_fails() -> None:
    def close(client: Client) -> None:
        if client.name == "a":
            raise RuntimeError("close failed")
        client.close()

    clients = Pool(4, close)
    a, b = Client("a"), Client("b")
    clients.give("a", a)
    clients.give("b", b)
    clients.clear()
    assert b.closed
    assert clients.take("a", lambda: Client("new a")).name == "new a"


# -- kept_consumer, the readers and the tasks, on a fake Kafka -----------------------------


class Message:
    """A record (or a partition end, EOF) as confluent-kafka's consumer gives it."""

    def __init__(self, topic: str, partition: int, offset: int, eof: bool = False) -> None:
        self._topic, self._partition, self._offset = topic, partition, offset
        self._error = KafkaError(KafkaError._PARTITION_EOF) if eof else None

    def error(self) -> KafkaError | None:
        return self._error

    def topic(self) -> str:
        return self._topic

    def partition(self) -> int:
        return self._partition

    def offset(self) -> int:
        return self._offset

    def key(self) -> bytes:
        return f"ok-{self._offset}".encode()

    def value(self) -> bytes:
        return b"v"

    def headers(self) -> list:
        return [("final_topic", b"orders")]

    def timestamp(self) -> tuple[int, int]:
        return (1, 1_000)


class Topics:
    topics = {"orders": None, "delays": None}


class FakeConsumer:
    """A consumer over `log` (topic -> records per partition): `assign` one partition at an
    offset, `consume` its records from there, then EOF at its end."""

    def __init__(self, log: dict[str, int], options: dict) -> None:
        self.log = log
        self.options = options
        self.position: tuple[str, int, int] | None = None
        self.assigned: list[tuple[str, int, int]] = []
        self.unassigned = 0
        self.closed = False
        self.fail_unassign = False

    def assign(self, partitions) -> None:
        assert not self.closed
        [tp] = partitions
        self.position = (tp.topic, tp.partition, tp.offset)
        self.assigned.append(self.position)

    def poll(self, timeout: float) -> Message | None:
        first = self.consume(1, timeout)
        return first[0] if first else None

    def consume(self, num_messages: int, timeout: float) -> list[Message]:
        assert self.position is not None and not self.closed
        topic, partition, offset = self.position
        end = self.log.get(topic, 0)
        last = min(offset + num_messages, end)
        messages = [Message(topic, partition, o) for o in range(offset, last)]
        if last == end and len(messages) < num_messages:
            messages.append(Message(topic, partition, end, eof=True))
        self.position = (topic, partition, last)
        return messages

    def unassign(self) -> None:
        if self.fail_unassign:
            raise RuntimeError("unassign failed")
        self.position = None
        self.unassigned += 1

    def list_topics(self, timeout: float) -> Topics:
        return Topics()

    def close(self) -> None:
        self.closed = True


@pytest.fixture
def kafka(monkeypatch) -> Iterator[list[FakeConsumer]]:
    """Every consumer `worker_clients` makes, over a log of 30 records per partition of
    "orders" and 5 per partition of "delays"; an empty pool before and after."""
    made: list[FakeConsumer] = []
    log = {"orders": 30, "delays": 5}

    def make_consumer(bootstrap_servers, options, *, secret_options=()) -> FakeConsumer:
        made.append(FakeConsumer(log, dict(options)))
        return made[-1]

    monkeypatch.setattr(worker_clients, "make_consumer", make_consumer)
    monkeypatch.setattr(
        worker_clients, "_consumers", Pool(worker_clients.MAX_CONSUMERS, FakeConsumer.close)
    )
    yield made
    worker_clients.close_all()


def test_a_consumer_is_kept_for_the_next_block_with_the_same_settings(kafka) -> None:
    before = worker_clients.opened()
    with kept_consumer("b:9092", {"a": "1"}) as first:
        first.assign([range_reader.TopicPartition("orders", 0, 0)])
    with kept_consumer("b:9092", {"a": "1"}) as again:
        pass
    with kept_consumer("b:9092", {"a": "2"}) as other:
        pass
    with kept_consumer("b:9092", {"a": "1"}, secret_options=("a",)) as masked:
        pass

    assert again is first and first.unassigned == 2 and first.position is None
    assert len({id(c) for c in (first, other, masked)}) == 3
    assert worker_clients.opened() - before == 3 == len(kafka)
    assert not any(consumer.closed for consumer in kafka)


def test_a_block_that_raises_closes_its_consumer_instead_of_keeping_it(kafka) -> None:
    with pytest.raises(ValueError, match="read failed"):
        with kept_consumer("b:9092", {}) as broken:
            raise ValueError("read failed")
    with kept_consumer("b:9092", {}) as fresh:
        pass

    assert broken.closed and broken.unassigned == 0
    assert fresh is not broken and not fresh.closed


def test_a_consumer_that_cannot_be_unassigned_is_closed_without_failing_the_block(kafka) -> None:
    with kept_consumer("b:9092", {}) as stuck:
        stuck.fail_unassign = True
    with kept_consumer("b:9092", {}) as fresh:
        pass
    assert stuck.closed and fresh is not stuck


def test_the_pool_keeps_at_most_max_consumers(kafka) -> None:
    for n in range(worker_clients.MAX_CONSUMERS + 2):
        with kept_consumer("b:9092", {"n": str(n)}):
            pass
    assert [consumer.closed for consumer in kafka] == [True, True] + [False] * (
        worker_clients.MAX_CONSUMERS
    )
    worker_clients.close_all()
    assert all(consumer.closed for consumer in kafka)


def part(topic: str, partition: int, start: int, end: int, **options: str) -> KafkaInputPartition:
    return KafkaInputPartition(topic, partition, start, end, "b:9092", options)


def offsets(chunks: Iterator[list]) -> list[int]:
    return [message.offset() for chunk in chunks for message in chunk]


def test_one_consumer_reads_range_after_range_of_many_partitions(kafka) -> None:
    before = worker_clients.opened()
    for partition in range(24):
        assert offsets(read_messages(part("orders", partition, 0, 10))) == list(range(10))
        assert offsets(read_messages(part("orders", partition, 10, 30))) == list(range(10, 30))
    # A read's own settings are part of the key: read_committed reads get a consumer apart.
    assert offsets(read_messages(part("delays", 3, 2, 5, **{"isolation.level": "x"}))) == [2, 3, 4]

    assert worker_clients.opened() - before == 2 == len(kafka)
    main, tiers = kafka
    assert len(main.assigned) == 48 and main.unassigned == 48 and not main.closed
    assert main.options["auto.offset.reset"] == "error" and main.options["enable.partition.eof"]
    assert tiers.options["isolation.level"] == "x" and tiers.assigned == [("delays", 3, 2)]


def test_a_failed_read_closes_its_consumer_and_the_next_read_opens_another(
    kafka, monkeypatch
) -> None:
    with monkeypatch.context() as patch:
        patch.setattr(range_reader, "STALL_TIMEOUT_S", 0.0)
        with pytest.raises(KafkaSourceError, match="nothing received"):
            list(read_messages(part("orders", 0, 0, 40)))  # the log ends at 30: EOF before 40
    assert offsets(read_messages(part("orders", 0, 0, 5))) == list(range(5))

    stalled, fresh = kafka
    assert stalled.closed and not fresh.closed


def test_a_read_left_part_way_closes_its_consumer(kafka) -> None:
    reading = read_messages(part("orders", 0, 0, 30))
    next(reading)
    reading.close()
    assert kafka[0].closed


def ranges(*rows: tuple) -> Iterator[pa.RecordBatch]:
    """Rows of (topic, partition, start, end) and optionally records lost."""
    schema = to_arrow_schema(RANGE_SCHEMA)
    yield pa.RecordBatch.from_pylist(
        [dict(zip(schema.names[: len(row)], row, strict=True)) for row in rows], schema=schema
    )


def counters_of(results: Iterator[pa.RecordBatch]) -> dict:
    rows = pa.Table.from_batches(list(results)).to_pylist()
    [counters] = [json.loads(row["counters"]) for row in rows if row["kind"] == "counters"]
    return counters


def test_a_routing_task_counts_the_clients_it_opened(kafka, plan) -> None:
    plan = replace(plan, bootstrap_servers="b:9092")
    every_partition = [("orders", p, 0, 30) for p in range(24)]

    first = counters_of(run_task(plan, ranges(*every_partition)))
    second = counters_of(run_task(plan, ranges(*every_partition)))

    assert first["records_main"] == second["records_main"] == 24 * 30
    assert first["kafka_clients_opened"] == 1
    assert "kafka_clients_opened" not in second  # the worker kept its consumer


def test_a_delay_router_task_counts_the_clients_it_opened(kafka, forward_plan) -> None:
    first = counters_of(run_forwarding_task(forward_plan, ranges(("delays", 0, 0, 5))))
    second = counters_of(run_forwarding_task(forward_plan, ranges(("delays", 1, 0, 5))))

    assert first["forwarded"] == second["forwarded"] == 5
    # One consumer reads the delay topic (read_committed), another lists the topics.
    assert first["kafka_clients_opened"] == 2 == len(kafka)
    assert "kafka_clients_opened" not in second


def test_tasks_count_the_records_lost_a_range_row_carries_and_read_nothing_for_it(
    kafka, plan, forward_plan
) -> None:
    routed = counters_of(run_task(plan, ranges(("orders", 0, 30, 30, 7))))
    forwarded = counters_of(run_forwarding_task(forward_plan, ranges(("delays", 0, 5, 5, 4))))

    assert routed["records_lost"] == 7 and forwarded["records_lost"] == 4
    assert "records_main" not in routed and "records_delayed" not in forwarded
    assert kafka == []  # no consumer opened for an empty range
