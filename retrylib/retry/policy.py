"""Retry decisions: which delay tier a failed record goes to, when it is due, or dead letter.

Everything here is pure and deterministic: the caller passes the time (`now_ms`, recorded
once per batch so a replayed batch decides the same) and the record's deterministic id,
which seeds the jitter.
"""

from __future__ import annotations

import hashlib
import math
import traceback
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from retrylib.config.importing import import_object
from retrylib.config.topic_names import ANY_TOPIC
from retrylib.errors import NonRetryable, RetryAfter
from retrylib.retry.headers import MAX_ERROR_MESSAGE_BYTES, MAX_STACK_TRACE_BYTES, bound_text
from retrylib.retry.outcomes import Reason


def tiers_of(retry_topics: Mapping[str, tuple[str, ...]], topic: str) -> tuple[str, ...] | None:
    """The retry tier topics of main topic `topic` (`ANY_TOPIC`'s for a pattern), or None."""
    return retry_topics.get(topic, retry_topics.get(ANY_TOPIC))


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how long to retry.

    `delays_ms[i]` is the fixed delay of retry tier i; `max_attempts` counts every handler
    call, the first delivery included; `jitter` is the largest extra delay as a fraction of
    the tier's delay (at most 1); `non_retryable` are exception classes that go straight to
    the dead letter; `max_retry_after_ms` is the longest wait a `RetryAfter` may ask for;
    `timeout_ms`, when set, is the longest a record keeps retrying after its first failure;
    `dead_letter_routes` are (exception class, topic) pairs, the first match naming the
    dead-letter topic. Raises `ValueError` naming the field when a value is out of range.
    """

    delays_ms: tuple[int, ...]
    max_attempts: int
    jitter: float
    non_retryable: tuple[type[BaseException], ...] = ()
    max_retry_after_ms: int = 3_600_000
    timeout_ms: int | None = None
    dead_letter_routes: tuple[tuple[type[BaseException], str], ...] = ()

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError(f"max_attempts must be >= 1, got {self.max_attempts!r}")
        if self.max_attempts > 1 and not self.delays_ms:
            raise ValueError("delays_ms must name at least one delay when max_attempts > 1")
        if any(delay < 0 for delay in self.delays_ms):
            raise ValueError(f"delays_ms must all be >= 0, got {self.delays_ms!r}")
        if not (math.isfinite(self.jitter) and 0 <= self.jitter <= 1):
            raise ValueError(f"jitter must be a number from 0 to 1, got {self.jitter!r}")
        if self.max_retry_after_ms < 0:
            raise ValueError(f"max_retry_after_ms must be >= 0, got {self.max_retry_after_ms!r}")
        if self.timeout_ms is not None and self.timeout_ms <= 0:
            raise ValueError(f"timeout_ms must be > 0, got {self.timeout_ms!r}")
        for cls in self.non_retryable:
            if not (isinstance(cls, type) and issubclass(cls, BaseException)):
                raise ValueError(f"non_retryable must hold exception classes, got {cls!r}")

    @classmethod
    def from_names(
        cls,
        delays_ms: Sequence[int],
        max_attempts: int,
        jitter: float,
        non_retryable_names: Sequence[str],
        max_retry_after_ms: int,
        timeout_ms: int | None = None,
        dead_letter_routes: Sequence[tuple[str, str]] = (),
    ) -> RetryPolicy:
        """Build a policy from config values, exception classes by name.

        Names are builtins ("ValueError") or "module:Class". Raises `ValueError` naming the
        entry when it does not import or is not an exception class, and for the range errors
        listed on the class.
        """
        return cls(
            delays_ms=tuple(delays_ms),
            max_attempts=max_attempts,
            jitter=jitter,
            non_retryable=tuple(_exception_class(name) for name in non_retryable_names),
            max_retry_after_ms=max_retry_after_ms,
            timeout_ms=timeout_ms,
            dead_letter_routes=tuple(
                (_exception_class(name), topic) for name, topic in dead_letter_routes
            ),
        )

    def dead_letter_topic(self, error: BaseException, default: str) -> str:
        """The dead-letter topic of a record whose last error is `error`: the first route
        whose class `error` is an instance of, else `default`."""
        for cls, topic in self.dead_letter_routes:
            if isinstance(error, cls):
                return topic
        return default


def _exception_class(name: str) -> type[BaseException]:
    try:
        obj = import_object(name)
    except (ImportError, AttributeError) as e:
        raise ValueError(f"exception class {name!r} does not resolve: {e}") from e
    if not (isinstance(obj, type) and issubclass(obj, BaseException)):
        raise ValueError(f"exception class {name!r} is not an exception class, got {obj!r}")
    return obj


class RetryDecision(NamedTuple):
    """Send the record to retry tier `tier` (0-based), produced with `kafka_timestamp_ms`.

    The tier's reader releases a record once its Kafka timestamp <= now - tier delay. The
    timestamp is never later than `not_before_ms` - tier delay, so the record is never handled
    early (one released before `not_before_ms` goes back to its tier: `tier_timestamp_ms`).
    """

    tier: int
    not_before_ms: int
    kafka_timestamp_ms: int


@dataclass(frozen=True)
class DeadLetterDecision:
    """Send the record to the dead letter, for `reason`."""

    reason: Reason


def decide(
    policy: RetryPolicy,
    *,
    error: BaseException,
    attempt: int,
    record_id: str,
    now_ms: int,
    first_failure_ms: int | None = None,
) -> RetryDecision | DeadLetterDecision:
    """Decide what happens to a record whose handler call number `attempt` just failed.

    `attempt` is 0 for the first delivery. Non-retryable errors (`NonRetryable` or a class in
    `policy.non_retryable`) dead-letter at once; otherwise, once `attempt + 1` calls reach
    `policy.max_attempts`, the record dead-letters as exhausted, and once `policy.timeout_ms`
    has passed since `first_failure_ms` (this failure's `now_ms` when None) as
    "retry_timeout", whatever attempts remain. A `RetryAfter` is honoured
    without jitter even if its class is listed as non-retryable, as the handler asked for it
    explicitly; one asking for more than `policy.max_retry_after_ms` (infinity too) dead-letters
    as "retry_after_too_long", and one whose seconds are not a number >= 0 is an ordinary
    retryable failure. Any other `BaseException` is an ordinary retryable failure. Raises
    `ValueError` if `attempt` is negative.
    """
    if attempt < 0:
        raise ValueError(f"attempt must be >= 0, got {attempt!r}")
    if _is_non_retryable(policy, error):
        return DeadLetterDecision(Reason.NON_RETRYABLE)
    if attempt + 1 >= policy.max_attempts:
        return DeadLetterDecision(Reason.ATTEMPTS_EXHAUSTED)
    first = now_ms if first_failure_ms is None else first_failure_ms
    if policy.timeout_ms is not None and now_ms - first >= policy.timeout_ms:
        return DeadLetterDecision(Reason.RETRY_TIMEOUT)
    requested_ms = _requested_ms(error)
    if requested_ms is not None:
        if requested_ms > policy.max_retry_after_ms:
            return DeadLetterDecision(Reason.RETRY_AFTER_TOO_LONG)
        return _retry_after(policy, requested_ms=requested_ms, now_ms=now_ms)
    return _scheduled(policy, next_attempt=attempt + 1, record_id=record_id, now_ms=now_ms)


def _requested_ms(error: BaseException) -> float | None:
    """The wait a `RetryAfter` asks for, in ms (infinity stays infinite); None when `error`
    is not one or its seconds are not a number >= 0 (a subclass may set anything)."""
    if not isinstance(error, RetryAfter):
        return None
    seconds = getattr(error, "seconds", None)
    if not isinstance(seconds, (int, float)) or math.isnan(seconds) or seconds < 0:
        return None
    return math.inf if math.isinf(seconds) else math.ceil(seconds * 1000)


def _is_non_retryable(policy: RetryPolicy, error: BaseException) -> bool:
    if isinstance(error, RetryAfter):
        return False
    return isinstance(error, NonRetryable) or isinstance(error, policy.non_retryable)


def _scheduled(
    policy: RetryPolicy, *, next_attempt: int, record_id: str, now_ms: int
) -> RetryDecision:
    tier = min(next_attempt, len(policy.delays_ms)) - 1
    base = policy.delays_ms[tier]
    delay = base + _jitter_ms(base, policy.jitter, record_id, next_attempt)
    return _decision(policy, tier, not_before_ms=now_ms + delay, now_ms=now_ms)


def _retry_after(policy: RetryPolicy, *, requested_ms: int, now_ms: int) -> RetryDecision:
    fitting = [i for i, delay in enumerate(policy.delays_ms) if delay <= requested_ms]
    tier = max(fitting, key=lambda i: policy.delays_ms[i], default=0)
    return _decision(policy, tier, not_before_ms=now_ms + requested_ms, now_ms=now_ms)


def _decision(policy: RetryPolicy, tier: int, *, not_before_ms: int, now_ms: int) -> RetryDecision:
    delay_ms = policy.delays_ms[tier]
    return RetryDecision(
        tier=tier,
        not_before_ms=not_before_ms,
        kafka_timestamp_ms=tier_timestamp_ms(not_before_ms, delay_ms, now_ms),
    )


def tier_timestamp_ms(not_before_ms: int, delay_ms: int, now_ms: int) -> int:
    """The Kafka timestamp of a record produced at `now_ms` to a tier of delay `delay_ms`.

    The tier releases a record at its timestamp + `delay_ms`, so `not_before_ms` - `delay_ms`
    makes it due exactly on time. The timestamp is capped at `now_ms` + `delay_ms`: a tier
    releases records in offset order, so a record with a later timestamp holds back every
    record behind it, and the cap bounds that hold-up by one delay of the tier. A record
    released before its `not_before_ms` (a `RetryAfter` longer than twice the tier's delay)
    is produced to its tier again with this timestamp, hop by hop, until it is due.
    """
    return min(due_timestamp_ms(not_before_ms, delay_ms), now_ms + delay_ms)


STAMP_SLACK_MS = 1_000
"""How far a record's Kafka timestamp may run ahead of a reader's clock beyond what the
job's own producers stamp (clocks of two hosts differ by a little)."""


def latest_fair_timestamp_ms(now_ms: int, delay_ms: int, stamps_ahead: bool) -> int:
    """The latest Kafka timestamp a record of a tier of delay `delay_ms` may fairly carry at
    `now_ms`: with `stamps_ahead`, the job's producers stamp records up to one delay ahead of
    their clock (a handler job's tiers, `tier_timestamp_ms`), else no later than now (a delay
    router's topics). A record stamped later came from a clock that is off (brokers accept
    an hour ahead by default): Kafka's time index would hide every record behind it until
    its time, so readers pass over it (`kafka.source`)."""
    return now_ms + (delay_ms if stamps_ahead else 0) + STAMP_SLACK_MS


def due_timestamp_ms(due_ms: int, delay_ms: int) -> int:
    """The Kafka timestamp of a record that a tier of delay `delay_ms` releases at `due_ms`:
    `due_ms` - `delay_ms`. The tiers' one rule, which `due_time_ms` inverts; a tier's reader
    at `now_ms` takes the records stamped before `due_timestamp_ms(now_ms, delay_ms)`.
    """
    return due_ms - delay_ms


def due_time_ms(timestamp_ms: int, delay_ms: int) -> int:
    """When a tier of delay `delay_ms` releases a record with Kafka timestamp `timestamp_ms`:
    `timestamp_ms` + `delay_ms` (the inverse of `due_timestamp_ms`)."""
    return timestamp_ms + delay_ms


def _jitter_ms(base_ms: int, jitter: float, record_id: str, attempt: int) -> int:
    """Return a deterministic extra delay in [0, jitter * base_ms], seeded by (id, attempt)."""
    if not (jitter and base_ms):
        return 0  # what the hash would give, without hashing (no jitter is the default)
    digest = hashlib.sha256(f"{record_id}\x00{attempt}".encode()).digest()
    fraction = int.from_bytes(digest[:8], "big") / 2**64
    return math.floor(fraction * jitter * base_ms)


def is_due(not_before_ms: int, now_ms: int) -> bool:
    """Return True once `now_ms` has reached `not_before_ms`."""
    return now_ms >= not_before_ms


def describe_error(error: BaseException, *, with_trace: bool = True) -> tuple[str, str, str]:
    """Return (qualified class name, bounded message, bounded formatted traceback) of `error`.

    The class name looks like "builtins.ValueError". An error whose `str()` itself raises
    is described as "<unprintable ClassName>" rather than failing. Formatting a traceback
    costs far more than the rest; with `with_trace=False` the third item is "".
    """
    cls = type(error)
    trace = "".join(traceback.format_exception(error)) if with_trace else ""
    return (
        f"{cls.__module__}.{cls.__qualname__}",
        bound_text(_message(error), MAX_ERROR_MESSAGE_BYTES),
        bound_text(trace, MAX_STACK_TRACE_BYTES),
    )


def _message(error: BaseException) -> str:
    try:
        return str(error)
    except Exception:
        return f"<unprintable {type(error).__qualname__}>"
