"""The executor side of one micro-batch: route every record of one Spark task.

The task reads its records (Kafka records from Spark, or the offset ranges it reads from
Kafka itself), calls the handler on each (`handler_calls`) and keeps the outcome as data
(`results`): output rows, failures with attempts left as outgoing records for their retry
tier, the rest as outgoing records for the dead-letter topic and as dead-letter rows
(`retry_records`), and the task's counters.
The task only returns them to Spark; the driver stages them and applies them once
(`batch.commit`).
"""

from __future__ import annotations

import gc
import json
import logging
import time
from collections import Counter
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from functools import partial
from typing import TypeVar

import pyarrow as pa

from retrylib.kafka import worker_clients
from retrylib.kafka.arrow_records import RANGE_SCHEMA, header_lists
from retrylib.kafka.reading import Reading, reading_options
from retrylib.logs import configure_worker_logging
from retrylib.record import Record
from retrylib.retry.headers import without_reserved
from retrylib.retry.outcomes import Count
from retrylib.source.range_reader import KafkaInputPartition, read_messages, read_range
from retrylib.task.handler_calls import HandlerCalls
from retrylib.task.plan import TaskPlan
from retrylib.task.results import ResultRows
from retrylib.task.retry_records import Delivery
from retrylib.task.vectorized import (
    carries_reserved_headers,
)

log = logging.getLogger(__name__)

_RANGE_COLUMNS = RANGE_SCHEMA.names
_GC_FIRST_THRESHOLD = 50_000
T = TypeVar("T")


def _tier_index(retry_topics: Mapping[str, tuple[str, ...]]) -> dict[str, int]:
    return {topic: tier for topics in retry_topics.values() for tier, topic in enumerate(topics)}


class RoutingTask:
    """Routes the records of one task; see the module docstring."""

    def __init__(self, plan: TaskPlan) -> None:
        self.plan = plan
        self.tier_of = _tier_index(plan.retry_topics)
        self.results = ResultRows(plan.output_schema)
        self.counters: Counter[str] = Counter()
        self.calls = HandlerCalls(plan, self.tier_of, self.counters, self.results)
        self.read_ns = 0
        self.clients_before = worker_clients.opened()

    def route(self, batch: pa.RecordBatch) -> None:
        """Route a RecordBatch of Kafka records (`KAFKA_ARROW_SCHEMA`)."""
        if self.plan.handler_kind == "record":
            main, retries = self._decode(batch)
            self.calls.handle_each(main, None)
            self.calls.handle_retries(retries)
        else:
            self._handle_batch(batch)
        self.calls.flush()

    def route_range(self, topic: str, partition: int, start: int, end: int) -> None:
        """Read offsets `start` to `end` (exclusive) of `topic[partition]` and route them.

        Records go from the Kafka client to the handler without passing through Arrow when
        the handler takes one record at a time. Raises `KafkaSourceError` as `read_messages`.
        """
        reading = Reading.DELAYED_TOPICS if topic in self.tier_of else Reading.MAIN_TOPICS
        options = reading_options(self.plan.client_options, reading)
        part = KafkaInputPartition(
            topic,
            partition,
            start,
            end,
            self.plan.bootstrap_servers,
            options,
            self.plan.secret_options,
            self.plan.fail_on_data_loss,
        )
        if self.plan.handler_kind != "record":
            for batch in self._timed_read(read_range(part, self.count_lost)):
                self.route(batch)
            return
        for messages in self._timed_read(read_messages(part, self.count_lost)):
            if topic in self.tier_of:
                self.calls.handle_retries(self._retries_of_messages(topic, partition, messages))
            else:
                self.counters[Count.RECORDS_MAIN] += len(messages)
                self.calls.handle_each(
                    [
                        Record(
                            m.key(),
                            m.value(),
                            self._main_headers(m.headers()),
                            topic,
                            partition,
                            m.offset(),
                            m.timestamp()[1],  # -1 when the record has none
                        )
                        for m in messages
                    ],
                    None,
                )
            self.calls.flush()

    def count_lost(self, records: int) -> None:
        """Count `records` as lost: deleted from Kafka before they were read."""
        self.counters[Count.RECORDS_LOST] += records

    def _timed_read(self, chunks: Iterator[T]) -> Iterator[T]:
        """`chunks`, with the time spent waiting for each added to `read_ns`."""
        clock = time.perf_counter_ns
        while True:
            started = clock()
            chunk = next(chunks, None)
            self.read_ns += clock() - started
            if chunk is None:
                return
            yield chunk

    def finish(self) -> Iterator[pa.RecordBatch]:
        """Handles the retries read ahead as they fall due, then yields the result rows not
        yet handed over and the task's counters row."""
        self.calls.finish()
        yield from self.results.drain()
        self.calls.close()
        self.counters[Count.HANDLER_MS] = self.calls.handler_ns // 1_000_000
        if self.read_ns:
            self.counters[Count.KAFKA_READ_MS] = self.read_ns // 1_000_000
        opened = worker_clients.opened() - self.clients_before
        if opened:
            self.counters[Count.KAFKA_CLIENTS_OPENED] = opened
        yield self.results.counters(json.dumps(dict(self.counters)))

    # -- reading a record ---------------------------------------------------------------

    def _decode(self, batch: pa.RecordBatch) -> tuple[list[Record], list[Delivery]]:
        """The main-topic records of `batch`, and the Deliveries of its retries that are due."""
        columns = [
            # Integer microseconds convert to Python far faster than aware datetimes.
            (
                batch.column(name).cast(pa.int64()) if name == "timestamp" else batch.column(name)
            ).to_pylist()
            for name in ("key", "value", "topic", "partition", "offset", "timestamp")
        ]
        rows_headers = header_lists(batch.column("headers"))
        main, retries = [], []
        for key, value, topic, partition, offset, micros, header_pairs in zip(
            *columns, rows_headers, strict=True
        ):
            millis = -1 if micros is None else micros // 1000
            if topic not in self.tier_of:
                headers = self._main_headers(header_pairs)
                main.append(Record(key, value, headers, topic, partition, offset, millis))
                continue
            delivery = self.calls.retries.read_back(
                key, value, topic, partition, offset, millis, header_pairs
            )
            if delivery is not None:
                retries.append(delivery)
        self.counters[Count.RECORDS_MAIN] += len(main)
        return main, retries

    def _main_headers(self, header_pairs: list | None) -> list:
        """A main-topic record's headers without the reserved ones, which only retrylib may
        set: kept, they would reach the handler and the dead letter as the record's own."""
        if not header_pairs:
            return []
        headers, removed = without_reserved(header_pairs)
        if removed:
            self.counters[Count.RESERVED_HEADERS_REMOVED] += removed
        return headers

    def _retries_of_messages(self, topic: str, partition: int, messages: list) -> list[Delivery]:
        deliveries = (
            self.calls.retries.read_back(
                m.key(),
                m.value(),
                topic,
                partition,
                m.offset(),
                m.timestamp()[1],
                m.headers() or [],
            )
            for m in messages
        )
        return [delivery for delivery in deliveries if delivery is not None]

    def _handle_batch(self, batch: pa.RecordBatch) -> None:
        """One vectorised handler call for `batch` (`HandlerCalls.handle_batch`).

        A batch of main-topic records goes to the handler column by column; records are
        decoded one by one only when the batch holds retries or some rows failed.
        """
        topics = set(batch.column("topic").unique().to_pylist())
        fast = topics.isdisjoint(self.tier_of) and not carries_reserved_headers(batch)
        deliveries = None if fast else self._deliveries(batch)
        if deliveries == []:  # every retry row was a duplicate, not yet due or corrupt
            return
        self.calls.handle_batch(batch, deliveries, partial(self._deliveries, batch))

    def _deliveries(self, batch: pa.RecordBatch) -> list[Delivery]:
        """A Delivery for every record of `batch` that is handled now."""
        main, retries = self._decode(batch)
        return [self.calls.first_delivery(record) for record in main] + retries


def run_task(plan: TaskPlan, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """The `mapInArrow` body: route every record of this task, yielding its result rows
    (`retrylib.task.results`) as they are decided and its counters at the end.

    The input is Kafka records (`KAFKA_SCHEMA`, from Spark's built-in Kafka source) or
    offset ranges (`RANGE_SCHEMA`, from `retrylib_kafka` with `retrylib.emit = ranges`),
    which the task reads from Kafka itself.
    """
    configure_worker_logging()
    with _fewer_collections():
        task = RoutingTask(plan)
        for batch in batches:
            if batch.schema.names[: len(_RANGE_COLUMNS)] == _RANGE_COLUMNS:
                for topic, partition, start, end, lost, *queues in zip(
                    *(column.to_pylist() for column in batch.columns), strict=True
                ):
                    if queues and queues[0] is not None:  # a key group's first range
                        assert task.calls.key_order is not None
                        task.calls.key_order.load(queues[0])
                    if lost:
                        task.count_lost(lost)
                    if start < end:
                        task.route_range(topic, partition, start, end)
            else:
                task.route(batch)
            yield from task.results.drain()
        yield from task.finish()


@contextmanager
def _fewer_collections() -> Iterator[None]:
    """Run the cyclic garbage collector less often while a task routes records.

    A task allocates millions of objects that live for one chunk of records. With CPython's
    default first threshold (700 allocations) they survive into older generations and set
    off full collections: half of a trivial handler's task time, measured. Refcounting frees
    them anyway. The worker's own thresholds come back when the task ends.
    """
    previous = gc.get_threshold()
    gc.set_threshold(_GC_FIRST_THRESHOLD, *previous[1:])
    try:
        yield
    finally:
        gc.set_threshold(*previous)
