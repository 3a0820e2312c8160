"""Calling the handler on a routing task's records (`task.routing`), and keeping each
call's outcome.

A successful call's rows wait in `pending` and are written together (`flush`); a record
whose rows do not fit the output schema fails alone. A failed call, or a result the output
schema cannot hold, goes to `RetryRecords` (a retry copy or a dead letter); a record whose
key's order holds it (`retry.key_ordered`) is held. A record handler is called record by
record, or on the task's lanes (`handler.parallelism`); an arrow or pandas handler once per
batch (`handle_batch`). A retry read before it is due waits (`read_ahead`).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Sequence
from functools import lru_cache, partial
from typing import TYPE_CHECKING

import pyarrow as pa

from retrylib.handler import HandlerTimeout
from retrylib.record import Record
from retrylib.retry.key_order import KeyOrder
from retrylib.retry.outcomes import Count
from retrylib.retry.policy import RetryPolicy
from retrylib.task.call_bounds import TimedCall, bound_call
from retrylib.task.handler import (
    BadHandlerResult,
    Handler,
    as_failure,
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
    input_from_kafka,
    input_from_records,
    per_row_results,
)

if TYPE_CHECKING:
    from retrylib.task.plan import TaskPlan

HELD = object()
"""What a lane's call gives for a record its key order holds (`retry.key_order`)."""


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


class HandlerCalls:
    """The handler of one routing task, called on its records; see the module docstring.

    `counters` and `results` are the task's: the calls count and write into them.
    """

    def __init__(
        self,
        plan: TaskPlan,
        tier_of: dict[str, int],
        counters: Counter[str],
        results: ResultRows,
    ) -> None:
        self.plan = plan
        self.handler: Handler = load_handler(plan.handler, plan.handler_paths)
        # One per task: it owns the process's SIGALRM.
        timed = TimedCall(plan.handler_timeout_ms, counters)
        self.invoke = bound_call(self.handler, timed, isolate=plan.isolate)
        # After the handler's import, which may set the process's tracer provider.
        self.spans = (
            handler_spans(len(plan.tier_delays_ms)) if plan.handler_kind == "record" else None
        )
        self.columns = frozenset(plan.output_schema.names)
        self.results = results
        self.counters = counters
        self.hooks = Hooks(plan.hooks, plan.handler_paths, counters, timed, isolate=plan.isolate)
        self.handler_ns = 0
        # Successful calls whose rows are not yet written: (record, its Delivery if it
        # has one, rows). Written together; a record whose rows do not fit fails alone.
        self.pending: list[tuple[Record, Delivery | None, Sequence[dict]]] = []
        self.retries = RetryRecords(_retry_plan(plan), _policy(plan), tier_of, counters, self.hooks)
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
                counters,
                on_late=None if self.key_order is None else self.key_order.call_failed,
            )

    def finish(self) -> None:
        """Handle the retries read ahead as they fall due, write what is pending, and add the
        key queues' changes to the results."""
        for run in self.waiting.runs(self.clock):
            self._handle_due(run)
        self.flush()
        if self.key_order is not None:
            self.results.add("key_state", self.key_order.changes())

    def close(self) -> None:
        """Stop the lanes, if any."""
        if self.lanes is not None:
            self.lanes.close()

    def handle_retries(self, retries: list[Delivery]) -> None:
        """Call the handler on the due ones among `retries`; one read ahead of its due time
        (`TaskPlan.read_ahead_ms`) waits, with its key's later ones, until the task has read
        everything else (`retrylib.task.read_ahead`)."""
        self._handle_due(
            [delivery for delivery in retries if not self.waiting.must_wait(delivery, self.clock)]
        )

    def _handle_due(self, retries: list[Delivery]) -> None:
        if retries:
            self.retries.released(retries)
            self.handle_each([delivery.record for delivery in retries], retries)

    def handle_each(self, records: list[Record], deliveries: list[Delivery] | None) -> None:
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
            except (Exception, HandlerTimeout) as error:
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
        """`handle_each` with the calls spread over the task's lanes (`lanes`)."""
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

        Used record by record (`handle_each`) and by each lane (`lanes`): a lane keeps a
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

    def handle_batch(
        self,
        batch: pa.RecordBatch,
        deliveries: list[Delivery] | None,
        decode: Callable[[], list[Delivery]],
    ) -> None:
        """One vectorised handler call for `batch` (see `retrylib.task.vectorized`): its
        records' `deliveries`, or None when it holds main-topic records only, which go to the
        handler column by column and are decoded (`decode`) only when some rows failed.
        """
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
            for delivery in self._decoded(deliveries, decode):
                self.retries.fail(delivery, error)
            return
        if table is not None:
            if deliveries is None:
                self.counters[Count.RECORDS_MAIN] += batch.num_rows
            for output in table.to_batches():
                self.write_output(output)
            self.counters[Count.SUCCEEDED] += handler_input.num_rows
            return
        for delivery, outcome in zip(self._decoded(deliveries, decode), results, strict=True):
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

    @staticmethod
    def _decoded(
        deliveries: list[Delivery] | None, decode: Callable[[], list[Delivery]]
    ) -> list[Delivery]:
        """`deliveries`, decoded now if the fast path skipped that."""
        return deliveries if deliveries is not None else decode()

    def _delivery(self, record: Record, deliveries: list[Delivery] | None, index: int) -> Delivery:
        if deliveries is not None:
            return deliveries[index]
        return self.first_delivery(record)

    def first_delivery(self, record: Record) -> Delivery:
        return Delivery(record, record.topic, self.plan.job)

    def flush(self) -> None:
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
            self.write_output(batch)
            self.counters[Count.SUCCEEDED] += len(pending)
            return
        for record, delivery, rows in pending:
            try:
                batch = output_batch(list(rows), self.plan.output_schema)
            except (pa.ArrowException, TypeError, ValueError, OverflowError) as e:
                failure = BadHandlerResult(f"rows do not fit the output schema: {e}")
                self.retries.fail(delivery or self.first_delivery(record), failure)
                continue
            self.write_output(batch)
            self.counters[Count.SUCCEEDED] += 1

    def write_output(self, batch: pa.RecordBatch) -> None:
        self.results.add("output", batch)
        self.counters[Count.OUTPUT_ROWS] += batch.num_rows
