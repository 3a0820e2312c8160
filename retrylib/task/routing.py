"""The executor side of one micro-batch: route every record of one Spark task.

For each record the task calls the handler and keeps the outcome as data (`results`):
output rows, failures with attempts left as outgoing records for their retry tier, the rest
as outgoing records for the dead-letter topic and as dead-letter rows (`retry_records`), and
the task's counters.
The task only returns them to Spark; the driver stages them and applies them once
(`batch.commit`).
"""

from __future__ import annotations

import gc
import json
import logging
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from functools import lru_cache, partial
from typing import TypeVar

import pyarrow as pa

from retrylib.kafka import worker_clients
from retrylib.kafka.arrow_records import RANGE_SCHEMA
from retrylib.kafka.reading import Reading, reading_options
from retrylib.logs import configure_worker_logging
from retrylib.record import Record
from retrylib.retry.headers import without_reserved
from retrylib.retry.key_order import KeyOrder
from retrylib.retry.outcomes import Count
from retrylib.retry.policy import RetryPolicy
from retrylib.source.range_reader import KafkaInputPartition, read_messages, read_range
from retrylib.task.handler import (
    BadHandlerResult,
    Handler,
    TimedCall,
    as_failure,
    bound_call,
    load_handler,
    result_rows,
)
from retrylib.task.hooks import Hooks
from retrylib.task.lanes import Lanes
from retrylib.task.read_ahead import DueClock, WaitingRetries
from retrylib.task.results import ResultRows, output_batch
from retrylib.task.retry_records import Delivery, RetryPlan, RetryRecords
from retrylib.task.tracing import handler_spans
from retrylib.task.vectorized import (
    as_output_table,
    carries_reserved_headers,
    input_from_kafka,
    input_from_records,
    per_row_results,
)

log = logging.getLogger(__name__)

_RANGE_COLUMNS = RANGE_SCHEMA.names
_GC_FIRST_THRESHOLD = 50_000
HELD = object()
"""What a lane's call gives for a record its key order holds (`retry.key_order`)."""
T = TypeVar("T")


@dataclass(frozen=True)
class TaskPlan:
    """Everything a task needs, built once per batch on the driver and shipped in the closure.

    `now_ms` is read once per batch run, so every record of the run is judged at one time.
    """

    job: str
    batch_id: int
    now_ms: int
    handler: str
    handler_paths: tuple[str, ...]
    handler_timeout_ms: int | None
    output_schema: pa.Schema
    dead_letter_topic: str
    retry_topics: Mapping[str, tuple[str, ...]]  # main topic -> topic of each tier
    tier_delays_ms: tuple[int, ...]
    partition_counts: Mapping[str, int]  # retry and dead-letter topics -> partitions
    max_attempts: int
    jitter: float
    non_retryable: tuple[str, ...]
    max_retry_after_ms: int
    signing_key: bytes  # signs every outgoing record; a retry record must carry its signature
    handler_kind: str = "record"
    handler_parallelism: int = 1  # lanes per task (`lanes`), for record handlers
    bootstrap_servers: str = ""  # and client_options: how the task reads offset ranges
    client_options: Mapping[str, str] = field(default_factory=dict)
    secret_options: tuple[str, ...] = ()  # names among client_options, masked in logs
    fail_on_data_loss: bool = True
    hooks: Mapping[str, str] = field(default_factory=dict)  # record hook -> "module:function"
    isolate: bool = False  # each handler call in its own process (after a worker died)
    # Retry and dead-letter topic -> the largest record it accepts (`record_size`); a topic
    # missing here is not checked.
    max_record_bytes: Mapping[str, int] = field(default_factory=dict)
    retry_timeout_ms: int | None = None
    dead_letter_routes: tuple[tuple[str, str], ...] = ()  # (exception class name, topic)
    key_ordered: bool = False  # a key's later records wait behind its retries (`retry.key_order`)
    # Retries due up to this long after `now_ms` are read in this batch and wait to be due.
    read_ahead_ms: int = 0

    def isolated(self) -> TaskPlan | None:
        """This plan with each handler call in a process of its own, or None when it is so."""
        return None if self.isolate else replace(self, isolate=True)


def _tier_index(retry_topics: Mapping[str, tuple[str, ...]]) -> dict[str, int]:
    return {topic: tier for topics in retry_topics.values() for tier, topic in enumerate(topics)}


def _retry_plan(plan: TaskPlan) -> RetryPlan:
    return RetryPlan(
        job=plan.job,
        batch_id=plan.batch_id,
        now_ms=plan.now_ms,
        read_ahead_ms=plan.read_ahead_ms,
        signing_key=plan.signing_key,
        retry_topics=plan.retry_topics,
        tier_delays_ms=plan.tier_delays_ms,
        dead_letter_topic=plan.dead_letter_topic,
        dead_letter_routes=plan.dead_letter_routes,
        partition_counts=plan.partition_counts,
        max_record_bytes=plan.max_record_bytes,
    )


def _policy(plan: TaskPlan) -> RetryPolicy:
    return _cached_policy(
        plan.tier_delays_ms,
        plan.max_attempts,
        plan.jitter,
        plan.non_retryable,
        plan.max_retry_after_ms,
        plan.retry_timeout_ms,
        plan.dead_letter_routes,
    )


@lru_cache(maxsize=8)
def _cached_policy(
    delays_ms: tuple[int, ...],
    attempts: int,
    jitter: float,
    names: tuple[str, ...],
    max_retry_after_ms: int,
    timeout_ms: int | None,
    routes: tuple[tuple[str, str], ...],
) -> RetryPolicy:
    # Importing the exception classes costs more than a small task; workers are reused.
    return RetryPolicy.from_names(
        delays_ms, attempts, jitter, names, max_retry_after_ms, timeout_ms, routes
    )


class RoutingTask:
    """Routes the records of one task; see the module docstring."""

    def __init__(self, plan: TaskPlan) -> None:
        self.plan = plan
        self.handler: Handler = load_handler(plan.handler, plan.handler_paths)
        timed = TimedCall(plan.handler_timeout_ms)  # one: it owns the process's SIGALRM
        self.invoke = bound_call(self.handler, timed, isolate=plan.isolate)
        # After the handler's import, which may set the process's tracer provider.
        self.spans = (
            handler_spans(len(plan.tier_delays_ms)) if plan.handler_kind == "record" else None
        )
        self.tier_of = _tier_index(plan.retry_topics)
        self.columns = frozenset(plan.output_schema.names)
        self.results = ResultRows(plan.output_schema)
        self.counters: Counter[str] = Counter()
        self.hooks = Hooks(plan.hooks, plan.handler_paths, self.counters, timed)
        self.handler_ns = 0
        self.read_ns = 0
        self.clients_before = worker_clients.opened()
        # Successful calls whose rows are not yet written: (record, its Delivery if it
        # has one, rows). Written together; a record whose rows do not fit fails alone.
        self.pending: list[tuple[Record, Delivery | None, Sequence[dict]]] = []
        self.retries = RetryRecords(
            _retry_plan(plan), _policy(plan), self.tier_of, self.counters, self.hooks
        )
        self.waiting = WaitingRetries()  # retries read ahead, until due by `clock`
        self.clock = DueClock(plan.now_ms)
        self.key_order: KeyOrder | None = None
        if plan.key_ordered:
            self.key_order = self.retries.key_order = KeyOrder()
        self.lanes: Lanes | None = None
        if plan.handler_parallelism > 1 and plan.handler_kind == "record" and not plan.isolate:
            # The lanes keep the timeout themselves: SIGALRM only reaches the main thread.
            self.lanes = Lanes(
                plan.handler_parallelism,
                partial(self._call_between_hooks, call=self.handler),
                plan.handler_timeout_ms,
                on_late=None if self.key_order is None else self.key_order.call_failed,
            )

    def route(self, batch: pa.RecordBatch) -> None:
        """Route a RecordBatch of Kafka records (`KAFKA_ARROW_SCHEMA`)."""
        if self.plan.handler_kind == "record":
            main, retries = self._decode(batch)
            self._handle_each(main, None)
            self._handle_retries(retries)
        else:
            self._handle_batch(batch)
        self._flush()

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
                self._handle_retries(self._retries_of_messages(topic, partition, messages))
            else:
                self.counters[Count.RECORDS_MAIN] += len(messages)
                self._handle_each(
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
            self._flush()

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
        for run in self.waiting.runs(self.clock):
            self._handle_due(run)
        self._flush()
        if self.key_order is not None:
            self.results.add("key_state", self.key_order.changes())
        yield from self.results.drain()
        if self.lanes is not None:
            self.lanes.close()
        self.counters[Count.HANDLER_MS] = self.handler_ns // 1_000_000
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
            for name in ("key", "value", "topic", "partition", "offset", "timestamp", "headers")
        ]
        main, retries = [], []
        for key, value, topic, partition, offset, micros, headers in zip(*columns, strict=True):
            header_pairs = [(h["key"], h["value"]) for h in headers or ()]
            millis = -1 if micros is None else micros // 1000
            if topic not in self.tier_of:
                headers = self._main_headers(header_pairs)
                main.append(Record(key, value, headers, topic, partition, offset, millis))
                continue
            delivery = self.retries.read_back(
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
            self.retries.read_back(
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

    # -- handling -----------------------------------------------------------------------

    def _handle_retries(self, retries: list[Delivery]) -> None:
        """Call the handler on the due ones among `retries`; one read ahead of its due time
        (`TaskPlan.read_ahead_ms`) waits, with its key's later ones, until the task has read
        everything else (`retrylib.task.read_ahead`)."""
        self._handle_due(
            [delivery for delivery in retries if not self.waiting.must_wait(delivery, self.clock)]
        )

    def _handle_due(self, retries: list[Delivery]) -> None:
        if retries:
            self.retries.released(retries)
            self._handle_each([delivery.record for delivery in retries], retries)

    def _handle_each(self, records: list[Record], deliveries: list[Delivery] | None) -> None:
        """Call the handler once per record and keep each outcome.

        `deliveries` are the records' Deliveries when they are retries; first deliveries
        (None) get one only if they fail. A successful call's rows wait in `pending`.
        """
        if self.lanes is not None:
            self._handle_in_lanes(records, deliveries)
            return
        between, invoke, keep = self._call_between_hooks, self.invoke, self._keep
        clock = time.perf_counter_ns
        spent = 0
        for index, record in enumerate(records):
            started = clock()
            try:
                result = between(record, invoke)
            except Exception as error:
                spent += clock() - started
                self.retries.fail(self._delivery(record, deliveries, index), error)
                continue
            spent += clock() - started
            if result is HELD:
                self.retries.hold(self._delivery(record, deliveries, index))
            else:
                keep(record, deliveries, index, result)
        self.handler_ns += spent

    def _keep(
        self, record: Record, deliveries: list[Delivery] | None, index: int, result: object
    ) -> None:
        """Keep a successful call's rows in `pending`, or fail the record on a bad result."""
        if type(result) is dict and result.keys() <= self.columns:
            rows: Sequence[dict] = (result,)  # the common case, checked cheaply
        else:
            try:
                rows = result_rows(result, self.columns)
            except BadHandlerResult as error:
                self.retries.fail(self._delivery(record, deliveries, index), error)
                return
        self.pending.append((record, deliveries[index] if deliveries else None, rows))
        if self.key_order is not None:
            self.key_order.handled(record)

    def _handle_in_lanes(self, records: list[Record], deliveries: list[Delivery] | None) -> None:
        """`_handle_each` with the calls spread over the task's lanes (`lanes`)."""
        assert self.lanes is not None
        for index, call in enumerate(self.lanes.call_all(records)):
            self.handler_ns += call.elapsed_ns
            if call.result is HELD:
                self.retries.hold(self._delivery(records[index], deliveries, index))
            elif call.error is not None:
                self.retries.fail(self._delivery(records[index], deliveries, index), call.error)
            else:
                self._keep(records[index], deliveries, index, call.result)

    def _call_between_hooks(self, record: Record, call: Callable[[Record], object]) -> object:
        """`call(record)` (the handler) between `record`'s record hooks, in a span when the
        process traces (`retrylib.task.tracing`); `HELD` instead, with
        no call, when its key order holds it. When the call raises, its key's later records
        in this task are held (`KeyOrder.call_failed`) and what it raised is raised as the
        failure the record fails with (`as_failure`).

        Used record by record (`_handle_each`) and by each lane (`lanes`): a lane keeps a
        key's records in order, and the hooks see every call the same way.
        """
        key_order = self.key_order
        if key_order is not None and not key_order.admit(record):
            return HELD
        hooks = self.hooks if self.hooks.around_calls else None
        if hooks is not None:
            hooks.call("before_record", record)
        try:
            result = call(record) if self.spans is None else self.spans.call(record, call)
        except BaseException as raised:
            failure = as_failure(raised)
            if key_order is not None:
                key_order.call_failed(record)
            if hooks is not None:
                hooks.call("after_record", record, failure)
            try:
                if failure is raised:
                    raise
                raise failure from raised
            finally:
                # This frame is in the failure's traceback: kept here, the failure would make
                # a reference cycle of every failed call, which only the garbage collector
                # frees (when every record failed, its runs took some 15% of the routing).
                del failure
        if hooks is not None:
            hooks.call("after_record", record, None)
        return result

    def _delivery(self, record: Record, deliveries: list[Delivery] | None, index: int) -> Delivery:
        if deliveries is not None:
            return deliveries[index]
        return self._first_delivery(record)

    def _first_delivery(self, record: Record) -> Delivery:
        return Delivery(record, record.topic, self.plan.job)

    def _handle_batch(self, batch: pa.RecordBatch) -> None:
        """One vectorised handler call for `batch` (see `retrylib.task.vectorized`).

        A batch of main-topic records goes to the handler column by column; records are
        decoded one by one only when the batch holds retries or some rows failed.
        """
        topics = set(batch.column("topic").unique().to_pylist())
        fast = topics.isdisjoint(self.tier_of) and not carries_reserved_headers(batch)
        deliveries = None if fast else self._deliveries(batch)
        if deliveries == []:  # every retry row was a duplicate, not yet due or corrupt
            return
        if deliveries is not None:
            self._wait_until_due(deliveries)
        if deliveries is None:
            handler_input = input_from_kafka(batch)
        else:
            handler_input = input_from_records([d.record for d in deliveries])
        argument = handler_input if self.plan.handler_kind == "arrow" else handler_input.to_pandas()
        started = time.perf_counter_ns()
        try:
            result = self.invoke(argument)
            self.handler_ns += time.perf_counter_ns() - started
            table = as_output_table(result, handler_input.num_rows, self.plan.output_schema)
            results = None if table is not None else per_row_results(result, handler_input.num_rows)
        except BaseException as raised:
            error = as_failure(raised)
            for delivery in self._decoded(batch, deliveries):
                self.retries.fail(delivery, error)
            return
        if table is not None:
            if deliveries is None:
                self.counters[Count.RECORDS_MAIN] += batch.num_rows
            for output in table.to_batches():
                self._write_output(output)
            self.counters[Count.SUCCEEDED] += handler_input.num_rows
            return
        for delivery, outcome in zip(self._decoded(batch, deliveries), results, strict=True):
            if isinstance(outcome, BaseException):
                self.retries.fail(delivery, outcome)
                continue
            try:
                rows = result_rows(outcome, self.columns)
            except BadHandlerResult as error:
                self.retries.fail(delivery, error)
                continue
            self.pending.append((delivery.record, delivery, rows))

    def _wait_until_due(self, deliveries: list[Delivery]) -> None:
        """Wait until the last retry among `deliveries` is due: one call takes them all."""
        retries = [delivery for delivery in deliveries if delivery.due_ms is not None]
        if retries:
            self.clock.sleep_until(max(delivery.due_ms or 0 for delivery in retries))
            self.retries.released(retries)

    def _deliveries(self, batch: pa.RecordBatch) -> list[Delivery]:
        """A Delivery for every record of `batch` that is handled now."""
        main, retries = self._decode(batch)
        return [self._first_delivery(record) for record in main] + retries

    def _decoded(self, batch: pa.RecordBatch, deliveries: list[Delivery] | None) -> list[Delivery]:
        """`deliveries`, decoded from `batch` now if the fast path skipped that."""
        return deliveries if deliveries is not None else self._deliveries(batch)

    def _flush(self) -> None:
        self._flush_pending()
        self.retries.hand_over(self.results)

    def _flush_pending(self) -> None:
        """Write the pending output rows; a record whose rows do not fit the schema fails."""
        pending, self.pending = self.pending, []
        if not pending:
            return
        all_rows = [row for _, _, rows in pending for row in rows]
        try:
            batch = output_batch(all_rows, self.plan.output_schema)
        except (pa.ArrowException, TypeError, ValueError, OverflowError):
            batch = None
        if batch is not None:
            self._write_output(batch)
            self.counters[Count.SUCCEEDED] += len(pending)
            return
        for record, delivery, rows in pending:
            try:
                batch = output_batch(list(rows), self.plan.output_schema)
            except (pa.ArrowException, TypeError, ValueError, OverflowError) as e:
                failure = BadHandlerResult(f"rows do not fit the output schema: {e}")
                self.retries.fail(delivery or self._first_delivery(record), failure)
                continue
            self._write_output(batch)
            self.counters[Count.SUCCEEDED] += 1

    def _write_output(self, batch: pa.RecordBatch) -> None:
        self.results.add("output", batch)
        self.counters[Count.OUTPUT_ROWS] += batch.num_rows


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
                        assert task.key_order is not None
                        task.key_order.load(queues[0])
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
