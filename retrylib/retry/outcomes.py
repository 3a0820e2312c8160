"""What becomes of a record, by name: why it went to the dead letter, and the batch counters.

Pure: no Spark, no Kafka. These names are data users keep and query (a dead letter's
`reason` column and `retrylib.dead_letter.reason` header; the counters of the metrics log
line, the metrics table and `status`), so a name, once released, stays.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from enum import StrEnum
from typing import TypeVar

T = TypeVar("T")


class Reason(StrEnum):
    """Why a record went to the dead letter."""

    NON_RETRYABLE = "non_retryable"
    """`NonRetryable`, or an exception class listed in `retry.non_retryable`."""
    ATTEMPTS_EXHAUSTED = "attempts_exhausted"
    """`retry.max_attempts` handler calls failed."""
    BAD_HANDLER_RESULT = "bad_handler_result"
    """The handler returned what the output schema cannot hold (`handler.BadHandlerResult`):
    not retried, since the same record gets the same result."""
    RETRY_TIMEOUT = "retry_timeout"
    """`retry.timeout` passed since the first failure."""
    RETRY_AFTER_TOO_LONG = "retry_after_too_long"
    """A `RetryAfter` asked for more than `retry.max_retry_after`."""
    UNVERIFIED_RETRY_RECORD = "unverified_retry_record"
    """A record on a retry tier not signed by this job (`headers.sign`)."""
    RECORD_TOO_LARGE = "record_too_large"
    """The retry copy is larger than its tier topic accepts."""
    CORRUPT_RETRY_HEADERS = "corrupt_retry_headers"
    """A signed record on a retry tier whose retry headers cannot be read."""
    UNKNOWN_ORIGIN_TOPIC = "unknown_origin_topic"
    """The record's origin topic is no longer one of the job's main topics."""
    NO_FINAL_TOPIC = "no_final_topic"
    """A record on a delay router's topic names no destination (`task.forwarding`)."""
    UNKNOWN_FINAL_TOPIC = "unknown_final_topic"
    """A record on a delay router's topic names a destination that is not a topic."""
    CONTROL_FINAL_TOPIC = "control_final_topic"
    """A record on a delay router's topic names a retrylib control topic (`_retrylib.*`)."""
    DELAY_FINAL_TOPIC = "delay_final_topic"
    """A record on a delay router's topic names one of the router's own delay topics: it
    would come back to the router for ever."""
    TIMESTAMP_TOO_FAR_AHEAD = "timestamp_too_far_ahead"
    """A record on a delay router's topic was sent (`msg_ts`) further ahead of the router's
    clock than `delay_router.max_timestamp_ahead`: it would go round its topic for ever."""


class Count(StrEnum):
    """A counter a routing task keeps for its batch (summed over the batch's tasks), but
    `RETRIED`, which is summed from the tasks' tier counters (`retried`). A delay router's
    forwarding tasks keep those that apply to them (records lost, requeued, Kafka clients
    opened), and `ForwardCount`."""

    RECORDS_MAIN = "records_main"
    """Records read from main topics."""
    RECORDS_RETRY = "records_retry"
    """Records read from retry tiers."""
    SUCCEEDED = "succeeded"
    """Records the handler handled."""
    MAIN_FAILED = "main_failed"
    """Main-topic records whose first handler call failed (sent to a retry tier or the dead
    letter); what `[breaker]` watches."""
    OUTPUT_ROWS = "output_rows"
    """Rows for the output table."""
    DEAD_LETTERED = "dead_lettered"
    """Records sent to the dead letter."""
    DEAD_LETTERED_TOO_LARGE = "dead_lettered_too_large"
    """Of those, records whose retry copy was too large for its tier."""
    DEAD_LETTER_TRUNCATED = "dead_letter_truncated"
    """Dead-letter records cut to fit the dead-letter topic (in full in the table)."""
    DUPLICATES_SKIPPED = "duplicates_skipped"
    """Retry records seen twice in one batch."""
    REQUEUED_NOT_DUE = "requeued_not_due"
    """Retry records released before they were due, sent round their tier again."""
    SKIPPED_OTHER_JOB = "skipped_other_job"
    """Records on a shared tier written by another job."""
    SKIPPED_BY_HANDLER = "skipped_by_handler"
    """Records the handler dropped with `Skip`."""
    HELD_BEHIND_KEY = "held_behind_key"
    """Records held behind an earlier record of their key waiting in a tier
    (`retry.key_ordered`); a record held again in a later batch counts again."""
    RECORDS_LOST = "records_lost"
    """Records deleted from Kafka before the job read them, skipped (failOnDataLoss false)."""
    RESERVED_HEADERS_REMOVED = "reserved_headers_removed"
    """retrylib's own header names taken off main-topic records."""
    HOOK_ERRORS = "hook_errors"
    """Calls of the user's lifecycle hooks that raised (`hooks`)."""
    CALLS_TIMED_OUT = "calls_timed_out"
    """Calls of the user's code on the executors (handler, record hooks) that ran past
    `handler.timeout` and were interrupted (`task.call_bounds`)."""
    CALL_PROCESSES_ENDED = "call_processes_ended"
    """Of those, calls that did not stop when interrupted, whose own process was ended (in
    a batch run again with a process per call, after its worker was ended)."""
    HANDLER_MS = "handler_ms"
    """Time spent in the handler."""
    KAFKA_READ_MS = "kafka_read_ms"
    """Time a task spent reading Kafka itself (`kafka.source = "python"` and tiers)."""
    KAFKA_CLIENTS_OPENED = "kafka_clients_opened"
    """Kafka clients a routing task opened in its Python worker (`worker_clients.opened`);
    the worker keeps them for its next tasks."""
    RETRIED = "retried"
    """Records a batch sent to any retry tier: its `retried_tier_N` counters summed
    (`retried`), which the metrics, the query's observed metrics and `status` show beside
    the counters the tasks keep."""


class ForwardCount(StrEnum):
    """A counter only a delay router's forwarding task keeps (`task.forwarding`)."""

    RECORDS_DELAYED = "records_delayed"
    """Records read from a delay router's topics."""
    FORWARDED = "forwarded"
    """Records a delay router produced to the topic they name."""
    FORWARDED_TO_FALLBACK = "forwarded_to_fallback"
    """Records a delay router sent to its fallback topic: no destination they name exists."""
    UNROUTABLE = "unroutable"
    """Records with no destination and no fallback topic: logged at ERROR, not produced."""
    TIMESTAMP_HEADER_MISSING = "timestamp_header_missing"
    """Records whose sent-at header was missing or unreadable: delayed from their timestamp."""


RETRIED_TIER_PREFIX = "retried_tier_"


def retried_tier(tier: int) -> str:
    """The counter of records sent to retry tier `tier` (0 = the first), named as the tiers
    are numbered to users: from 1 ("retried_tier_1" for the first)."""
    return f"{RETRIED_TIER_PREFIX}{tier + 1}"


def retried(counters: Mapping[str, T], total: Callable[[list[T]], T] = sum) -> T:
    """`Count.RETRIED` of a batch's `counters`: its `retried_tier_N` entries added up by
    `total` (numbers by `sum`; the observed metrics add up SQL terms, `batch.observed`)."""
    return total([n for name, n in counters.items() if name.startswith(RETRIED_TIER_PREFIX)])
