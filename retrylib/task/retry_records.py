"""Retry records inside a routing task, both ways.

Out: a failed record becomes a signed copy for its next retry tier, or a dead letter (a row
for the dead-letter table and a signed record for the dead-letter topic). In: a record read
back from a tier is checked (this job's, signed, not seen, due) before the handler sees it.
Outgoing records and dead-letter rows wait here until the task hands them to Spark.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pyarrow as pa

from retrylib.errors import CorruptRetryHeaders, RetrylibError, Skip, UnverifiedRetryRecord
from retrylib.handler import BadHandlerResult
from retrylib.kafka.record_size import SIGNATURE_BYTES, fit, wire_size
from retrylib.record import Record
from retrylib.retry.headers import (
    JOB,
    RetryState,
    decode_retry_state,
    encode_dead_letter_headers,
    encode_retry_headers,
    is_signed_by,
    record_id,
    sign,
    split_headers,
)
from retrylib.retry.outcomes import Count, Reason, retried_tier
from retrylib.retry.policy import (
    RetryDecision,
    RetryPolicy,
    decide,
    describe_error,
    is_due,
    tier_timestamp_ms,
    tiers_of,
)
from retrylib.sinks.dead_letter import DEAD_LETTER_SCHEMA, DeadLetter
from retrylib.sinks.outgoing_records import OutgoingBuffer
from retrylib.task.results import LATENESS_SCHEMA, OUTGOING_KIND, ResultRows

if TYPE_CHECKING:
    from retrylib.retry.key_order import KeyOrder
    from retrylib.task.hooks import Hooks

log = logging.getLogger(__name__)

_HELD_MESSAGE = "held behind an earlier record of its key (retry.key_ordered)"


@dataclass(frozen=True)
class RetryPlan:
    """What a task's retry and dead-letter records need of its batch's plan (`TaskPlan`).

    `now_ms` is the batch's time; retries due up to `read_ahead_ms` after it are handled in
    the batch. `retry_topics` maps a main topic to the topic of each tier, whose delays are
    `tier_delays_ms`; `partition_counts` and `max_record_bytes` are of the retry and
    dead-letter topics (a topic missing from `max_record_bytes` is not checked).
    """

    job: str
    batch_id: int
    now_ms: int
    read_ahead_ms: int
    signing_key: bytes
    retry_topics: Mapping[str, tuple[str, ...]]
    tier_delays_ms: tuple[int, ...]
    dead_letter_topic: str
    dead_letter_routes: tuple[tuple[str, str], ...]  # (exception class name, topic)
    partition_counts: Mapping[str, int]
    max_record_bytes: Mapping[str, int]


@dataclass
class Delivery:
    """A record that failed or is a retry, with what is known of its earlier failures.

    A first delivery gets one only when it fails, and its id is computed only then: both
    would cost more, record by record, than routing it.
    """

    record: Record
    source_topic: str
    job: str
    known_id: str | None = None
    first_failure_ms: int | None = None
    due_ms: int | None = None  # a retry's: when its tier releases it; None for a first delivery

    @property
    def id(self) -> str:
        if self.known_id is None:
            record = self.record
            self.known_id = record_id(self.job, record.topic, record.partition, record.offset)
        return self.known_id


class RetryRecords:
    """The retry and dead-letter records of one task: see the module docstring."""

    def __init__(
        self,
        plan: RetryPlan,
        policy: RetryPolicy,
        tier_of: Mapping[str, int],
        counters: Counter[str],
        hooks: Hooks,
    ) -> None:
        self.plan = plan
        self.policy = policy
        self.tier_of = tier_of
        self.counters = counters
        self.hooks = hooks
        self.seen: set[tuple[str, int]] = set()
        self.job_header = plan.job.encode("utf-8")
        self.dead_letter_topics = {plan.dead_letter_topic, *(t for _, t in plan.dead_letter_routes)}
        self._outgoing = OutgoingBuffer()
        self._dead_rows: list[dict] = []
        self._lateness: tuple[list[int], list[int]] = ([], [])  # tiers, lateness in ms
        self.key_order: KeyOrder | None = None  # with retry.key_ordered: told every outcome

    def read_back(
        self, key, value, topic, partition, offset, timestamp_ms, header_pairs
    ) -> Delivery | None:
        """The Delivery of a record read from a retry tier, or None when it is not handled in
        this batch: another job's (skipped and counted), not signed by this job or with
        corrupt retry headers (dead-lettered), a duplicate, or not due within the batch's
        read-ahead (`RetryPlan.read_ahead_ms`; re-queued). One due later than now waits in the
        task (`released`)."""
        self.counters[Count.RECORDS_RETRY] += 1
        user_headers, own = split_headers(header_pairs)
        writer = own.get(JOB)
        if writer is not None and writer != self.job_header:
            # A neighbour sharing the tier topic handles its own records.
            self.counters[Count.SKIPPED_OTHER_JOB] += 1
            log.warning(
                "skipped %s[%d]@%d on a retry tier: written by job %r, not this job %r",
                topic,
                partition,
                offset,
                writer.decode("utf-8", errors="replace"),
                self.plan.job,
            )
            return None
        signed = is_signed_by(
            header_pairs, signing_key=self.plan.signing_key, topic=topic, key=key, value=value
        )
        try:
            if not signed:
                raise UnverifiedRetryRecord(
                    "record on a retry topic is not signed by this job (retrylib.signature "
                    "missing or wrong): written by someone else, changed after it was "
                    "written, or written before the job's checkpoint was replaced"
                )
            state = decode_retry_state(own)
        except (UnverifiedRetryRecord, CorruptRetryHeaders) as e:
            reason = Reason.UNVERIFIED_RETRY_RECORD if not signed else Reason.CORRUPT_RETRY_HEADERS
            record = Record(key, value, user_headers, topic, partition, offset, timestamp_ms)
            delivery = Delivery(record, topic, self.plan.job)
            self.dead_letter(delivery, e, reason, 0, _now_ms())
            return None
        if (state.id, state.attempt) in self.seen:
            self.counters[Count.DUPLICATES_SKIPPED] += 1
            return None
        self.seen.add((state.id, state.attempt))
        record = Record(
            key,
            value,
            user_headers,
            state.origin_topic,
            state.origin_partition,
            state.origin_offset,
            state.origin_timestamp_ms,
            state.attempt,
        )
        # A record held behind its key (attempt 0) has not failed yet.
        first_failure_ms = state.first_failure_ms if state.attempt else None
        delivery = Delivery(
            record, topic, self.plan.job, state.id, first_failure_ms, state.not_before_ms
        )
        if state.attempt >= self.policy.max_attempts:
            # retry.max_attempts was lowered while it waited: no call past the new limit.
            self.dead_letter(
                delivery,
                _exhausted_on_arrival(state, self.policy.max_attempts),
                Reason.ATTEMPTS_EXHAUSTED,
                state.attempt,
                _now_ms(),
            )
            return None
        if not is_due(state.not_before_ms, self.plan.now_ms + self.plan.read_ahead_ms):
            # A wait longer than the tier holds in one pass, or clocks that disagree: never
            # hand it over early, wait in the tier again.
            self.counters[Count.REQUEUED_NOT_DUE] += 1
            delay_ms = self.plan.tier_delays_ms[self.tier_of[topic]]
            timestamp = tier_timestamp_ms(state.not_before_ms, delay_ms, self.plan.now_ms)
            self.add_outgoing(topic, partition, timestamp, record, header_pairs[:-1])
            return None
        return delivery

    def released(self, deliveries: list[Delivery]) -> None:
        """Keep, for the batch's metrics, the lateness of retries handed to the handler now:
        now minus when each was due."""
        now_ms = _now_ms()
        tiers, lateness = self._lateness
        for delivery in deliveries:
            assert delivery.due_ms is not None
            tiers.append(self.tier_of[delivery.source_topic])
            lateness.append(max(0, now_ms - delivery.due_ms))

    def fail(self, delivery: Delivery, error: BaseException) -> None:
        """Route a failed record to its next retry tier or to the dead letter.

        Delays count from the moment of this failure, so a record never waits less than
        its tier's delay; the decision is fixed once the batch's manifest is written.
        """
        record = delivery.record
        if isinstance(error, Skip):
            self.counters[Count.SKIPPED_BY_HANDLER] += 1
            if self.key_order is not None:
                self.key_order.handled(record)
            log.info(
                "%s[%d]@%d skipped at the handler's request: %s",
                record.topic,
                record.partition,
                record.offset,
                describe_error(error, with_trace=False)[1],
            )
            return
        if record.attempt == 0:
            self.counters[Count.MAIN_FAILED] += 1
        failed_at = _now_ms()
        if isinstance(error, BadHandlerResult):
            # The handler's own bug, made again on every call with the same record: retrying
            # would only spend the attempts and hide the reason.
            reason = Reason.BAD_HANDLER_RESULT
            self.dead_letter(delivery, error, reason, record.attempt + 1, failed_at)
            return
        decision = decide(
            self.policy,
            error=error,
            attempt=record.attempt,
            record_id=delivery.id,
            now_ms=failed_at,
            first_failure_ms=delivery.first_failure_ms,
        )
        tier_topics = tiers_of(self.plan.retry_topics, record.topic)
        attempts = record.attempt + 1
        if not isinstance(decision, RetryDecision):
            self.dead_letter(delivery, error, decision.reason, attempts, failed_at)
            return
        if tier_topics is None:
            self.dead_letter(delivery, error, Reason.UNKNOWN_ORIGIN_TOPIC, attempts, failed_at)
            return
        error_class, message, _ = describe_error(error, with_trace=False)
        state = _state(delivery, attempts, decision.not_before_ms, failed_at, error_class, message)
        topic = tier_topics[decision.tier]
        headers = encode_retry_headers(record.headers, state)
        if self._too_large(topic, record, headers):
            self.dead_letter(delivery, error, Reason.RECORD_TOO_LARGE, attempts, failed_at)
            return
        self.add_outgoing(topic, record.partition, decision.kafka_timestamp_ms, record, headers)
        self.counters[retried_tier(decision.tier)] += 1
        if self.key_order is not None:
            self.key_order.retried(record, decision.tier, decision.not_before_ms)
        self.hooks.call("on_retry", record, decision.tier + 1, error)

    def hold(self, delivery: Delivery) -> None:
        """Stage `delivery` behind the waiting records of its key (`retry.key_order`): to the tier
        its key's head waits in, due with it, its attempts unchanged."""
        assert self.key_order is not None
        record = delivery.record
        tier_topics = tiers_of(self.plan.retry_topics, record.topic)
        if tier_topics is None:
            error = RetrylibError(f"{record.topic} is no longer a main topic of the job")
            self.dead_letter(
                delivery, error, Reason.UNKNOWN_ORIGIN_TOPIC, record.attempt, _now_ms()
            )
            return
        tier, not_before_ms = self.key_order.hold(record, self.plan.now_ms)
        held_at = _now_ms()
        state = _state(delivery, record.attempt, not_before_ms, held_at, "", _HELD_MESSAGE)
        headers = encode_retry_headers(record.headers, state)
        timestamp = tier_timestamp_ms(not_before_ms, self.plan.tier_delays_ms[tier], held_at)
        self.add_outgoing(tier_topics[tier], record.partition, timestamp, record, headers)
        self.counters[Count.HELD_BEHIND_KEY] += 1

    def dead_letter(
        self,
        delivery: Delivery,
        error: BaseException,
        reason: Reason,
        attempts: int,
        failed_at: int,
    ) -> None:
        record = delivery.record
        error_class, message, trace = describe_error(error)
        state = _state(delivery, attempts, failed_at, failed_at, error_class, message)
        dead = DeadLetter(
            delivery.id,
            record.topic,
            record.partition,
            record.offset,
            record.timestamp,
            delivery.source_topic,
            attempts,
            reason,
            error_class,
            message,
            trace,
            state.first_failure_ms,
            failed_at,
            record.key,
            record.value,
            record.headers,
        )
        self._dead_rows.append(dead.row(self.plan.job, self.plan.batch_id, failed_at))
        headers = encode_dead_letter_headers(
            record.headers, state, attempts=attempts, reason=reason, stack_trace=trace
        )
        topic = self.policy.dead_letter_topic(error, self.plan.dead_letter_topic)
        self.add_outgoing(topic, record.partition, failed_at, record, headers)
        self.counters[Count.DEAD_LETTERED] += 1
        if self.key_order is not None:
            self.key_order.handled(record)
        self.hooks.call("on_dead_letter", record, reason, error)

    def _too_large(self, topic: str, record: Record, headers: list) -> bool:
        """True (logged and counted) when the retry copy is more than `topic` accepts.

        Producing it would fail the batch on every replay; it goes to the dead letter.
        """
        limit = self.plan.max_record_bytes.get(topic)
        size = wire_size(record.key, record.value, headers) + SIGNATURE_BYTES
        if limit is None or size <= limit:
            return False
        log.warning(
            "%s[%d]@%d: retry copy of %d bytes is over the %d bytes %s accepts; "
            "dead-lettered as record_too_large",
            record.topic,
            record.partition,
            record.offset,
            size,
            limit,
            topic,
        )
        self.counters[Count.DEAD_LETTERED_TOO_LARGE] += 1
        return True

    def add_outgoing(self, topic, partition, timestamp_ms, record, headers) -> None:
        """Add `record` as an outgoing record for `topic`, with `headers` and the signature
        that covers them; a dead-letter record is first cut to fit its topic (the table keeps
        it in full)."""
        key, value = record.key, record.value
        limit = self.plan.max_record_bytes.get(topic)
        if topic in self.dead_letter_topics and limit is not None:
            fitted = fit(key, value, headers, limit - SIGNATURE_BYTES)
            key, value, headers = fitted.key, fitted.value, fitted.headers
            if fitted.cut:
                log.warning(
                    "%s[%d]@%d: dead-letter record of %d bytes is over the %d bytes %s "
                    "accepts; produced cut to %d bytes (in full in the dead-letter table)",
                    record.topic,
                    record.partition,
                    record.offset,
                    fitted.original_bytes + SIGNATURE_BYTES,
                    limit,
                    topic,
                    fitted.bytes + SIGNATURE_BYTES,
                )
                self.counters[Count.DEAD_LETTER_TRUNCATED] += 1
        signed = sign(headers, signing_key=self.plan.signing_key, topic=topic, key=key, value=value)
        partition %= self.plan.partition_counts[topic]
        self._outgoing.add(topic, partition, timestamp_ms, key, value, signed)

    def hand_over(self, results: ResultRows) -> None:
        """Move the outgoing records, dead-letter rows and lateness rows gathered so far into
        `results`."""
        outgoing = self._outgoing.take()
        if outgoing is not None:
            results.add(OUTGOING_KIND, outgoing)
        if self._dead_rows:
            dead = pa.RecordBatch.from_pylist(self._dead_rows, schema=DEAD_LETTER_SCHEMA)
            results.add("dead_letter", dead)
            self._dead_rows = []
        tiers, lateness = self._lateness
        if tiers:
            late = pa.RecordBatch.from_arrays(
                [pa.array(tiers, pa.int32()), pa.array(lateness, pa.int64())],
                schema=LATENESS_SCHEMA,
            )
            results.add("lateness", late)
            self._lateness = ([], [])


def _exhausted_on_arrival(state: RetryState, max_attempts: int) -> RetrylibError:
    return RetrylibError(
        f"retry.max_attempts is {max_attempts} and this record was already called "
        f"{state.attempt} times; its last error: {state.error_class}: {state.error_message}"
    )


def _state(
    delivery: Delivery,
    attempt: int,
    not_before_ms: int,
    failed_at: int,
    error_class: str,
    message: str,
) -> RetryState:
    record = delivery.record
    return RetryState(
        job=delivery.job,
        id=delivery.id,
        attempt=attempt,
        not_before_ms=not_before_ms,
        origin_topic=record.topic,
        origin_partition=record.partition,
        origin_offset=record.offset,
        origin_timestamp_ms=record.timestamp,
        first_failure_ms=delivery.first_failure_ms or failed_at,
        last_failure_ms=failed_at,
        error_class=error_class,
        error_message=message,
    )


def _now_ms() -> int:
    return int(time.time() * 1000)
