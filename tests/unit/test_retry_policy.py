from __future__ import annotations

import json
from typing import Any

import pytest

from retrylib.errors import NonRetryable, RetryAfter
from retrylib.retry.headers import MAX_ERROR_MESSAGE_BYTES, MAX_STACK_TRACE_BYTES
from retrylib.retry.policy import (
    DeadLetterDecision,
    RetryDecision,
    RetryPolicy,
    decide,
    describe_error,
    due_time_ms,
    due_timestamp_ms,
    is_due,
    tier_timestamp_ms,
)

NOW = 1_700_000_000_000
DELAYS = (1_000, 10_000, 60_000)


def policy(
    delays: tuple[int, ...] = DELAYS,
    max_attempts: int = 4,
    jitter: float = 0.0,
    non_retryable: tuple[type[BaseException], ...] = (),
) -> RetryPolicy:
    return RetryPolicy(
        delays_ms=delays, max_attempts=max_attempts, jitter=jitter, non_retryable=non_retryable
    )


def run(
    p: RetryPolicy, attempt: int, error: BaseException | None = None, record_id: str = "rid"
) -> RetryDecision | DeadLetterDecision:
    return decide(
        p, error=error or RuntimeError("boom"), attempt=attempt, record_id=record_id, now_ms=NOW
    )


def retry(p: RetryPolicy, attempt: int, record_id: str = "rid") -> RetryDecision:
    decision = run(p, attempt, record_id=record_id)
    assert isinstance(decision, RetryDecision)
    return decision


def _readable_at(decision: RetryDecision, delays: tuple[int, ...] = DELAYS) -> int:
    """When the tier reader first releases the record: Kafka timestamp <= now - tier delay."""
    return decision.kafka_timestamp_ms + delays[decision.tier]


# --- attempts and tiers --------------------------------------------------------------------


def test_max_attempts_one_dead_letters_the_first_failure() -> None:
    assert run(policy(max_attempts=1), attempt=0) == DeadLetterDecision("attempts_exhausted")


def test_max_attempts_one_needs_no_delays() -> None:
    p = policy(delays=(), max_attempts=1)
    assert run(p, attempt=0) == DeadLetterDecision("attempts_exhausted")


def test_four_attempts_over_three_delays_use_each_tier_then_dead_letter() -> None:
    p = policy(max_attempts=4)
    decisions = [run(p, attempt) for attempt in range(4)]
    assert decisions[:3] == [
        RetryDecision(tier=i, not_before_ms=NOW + DELAYS[i], kafka_timestamp_ms=NOW)
        for i in range(3)
    ]
    assert decisions[3] == DeadLetterDecision("attempts_exhausted")


@pytest.mark.parametrize("attempt", [4, 5, 100])
def test_attempts_beyond_the_limit_dead_letter(attempt: int) -> None:
    assert run(policy(max_attempts=4), attempt) == DeadLetterDecision("attempts_exhausted")


def test_tiers_cap_at_the_last_delay() -> None:
    p = policy(max_attempts=7)
    tiers = [retry(p, attempt).tier for attempt in range(6)]
    assert tiers == [0, 1, 2, 2, 2, 2]
    assert run(p, 6) == DeadLetterDecision("attempts_exhausted")


def test_zero_delay_tier_is_due_at_once() -> None:
    decision = run(policy(delays=(0,), max_attempts=2), attempt=0)
    assert decision == RetryDecision(tier=0, not_before_ms=NOW, kafka_timestamp_ms=NOW)


def test_negative_attempt_raises() -> None:
    with pytest.raises(ValueError, match="attempt must be >= 0, got -1"):
        run(policy(), attempt=-1)


@pytest.mark.parametrize("error", [SystemExit(1), KeyboardInterrupt(), GeneratorExit()])
def test_base_exceptions_are_ordinary_retryable_failures(error: BaseException) -> None:
    assert run(policy(), 0, error) == RetryDecision(0, NOW + 1_000, NOW)


# --- jitter --------------------------------------------------------------------------------


def test_jitter_only_adds_and_stays_within_bounds() -> None:
    p = policy(jitter=0.5, max_attempts=4)
    for n in range(500):
        for attempt in range(3):
            d = retry(p, attempt, f"id-{n}")
            base = DELAYS[attempt]
            assert NOW + base <= d.not_before_ms <= NOW + base + base // 2
            assert _readable_at(d) == d.not_before_ms


def test_jitter_is_deterministic_per_id_and_attempt() -> None:
    p = policy(jitter=1.0)
    assert run(p, 1, record_id="a") == run(p, 1, record_id="a")


def test_jitter_spreads_different_ids_and_attempts() -> None:
    p = policy(delays=(60_000,), max_attempts=10, jitter=1.0)
    by_id = {retry(p, 0, f"id-{n}").not_before_ms for n in range(200)}
    assert len(by_id) > 190
    spread = max(by_id) - min(by_id)
    assert spread > 0.8 * 60_000
    by_attempt = {retry(p, a, "same").not_before_ms for a in range(9)}
    assert len(by_attempt) == 9


def test_no_jitter_means_exact_delays() -> None:
    p = policy(jitter=0.0)
    assert {retry(p, 0, f"id-{n}").not_before_ms for n in range(50)} == {NOW + 1_000}


# --- RetryAfter ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("seconds", "tier"),
    [
        (0, 0),
        (0.5, 0),
        (1, 0),
        (9.999, 0),
        (10, 1),
        (59, 1),
        (60, 2),
        (3600, 2),
    ],
)
def test_retry_after_picks_largest_tier_not_longer_than_requested(
    seconds: float, tier: int
) -> None:
    d = run(policy(jitter=1.0), 0, RetryAfter(seconds))
    assert isinstance(d, RetryDecision)
    assert d.tier == tier
    assert d.not_before_ms == NOW + round(seconds * 1000)
    assert d.kafka_timestamp_ms == min(d.not_before_ms - DELAYS[tier], NOW + DELAYS[tier])
    assert _readable_at(d) <= d.not_before_ms


def test_retry_after_rounds_up_to_the_millisecond() -> None:
    d = run(policy(), 0, RetryAfter(0.0015))
    assert isinstance(d, RetryDecision) and d.not_before_ms == NOW + 2


def test_retry_after_still_counts_attempts() -> None:
    assert run(policy(max_attempts=2), 1, RetryAfter(5)) == DeadLetterDecision("attempts_exhausted")


@pytest.mark.parametrize("seconds", [3600.001, 1e17, float("inf")])
def test_retry_after_beyond_the_maximum_dead_letters(seconds: float) -> None:
    d = run(policy(), 1, RetryAfter(seconds))
    assert d == DeadLetterDecision("retry_after_too_long")


def test_retry_after_up_to_the_maximum_is_honoured() -> None:
    d = run(policy(), 1, RetryAfter(3600))
    assert isinstance(d, RetryDecision) and d.not_before_ms == NOW + 3_600_000


def test_retry_after_that_is_not_a_number_follows_the_schedule() -> None:
    assert run(policy(), 1, RetryAfter(float("nan"))) == RetryDecision(1, NOW + 10_000, NOW)


def test_retry_after_subclass_with_odd_seconds_follows_the_schedule() -> None:
    class Odd(RetryAfter):
        def __init__(self) -> None:
            super().__init__(1)
            self.seconds = "soon"  # type: ignore[assignment]

    assert run(policy(), 1, Odd()) == RetryDecision(1, NOW + 10_000, NOW)


@pytest.mark.parametrize("not_before", [NOW - 5_000, NOW, NOW + 9_000, NOW + 20_000, 2**62])
def test_tier_timestamp_is_never_early_nor_more_than_a_delay_ahead(not_before: int) -> None:
    stamp = tier_timestamp_ms(not_before, 10_000, NOW)
    assert stamp + 10_000 <= not_before  # released no sooner than due
    assert stamp <= NOW + 10_000  # holds back the records behind it at most one delay
    assert stamp == not_before - 10_000 or stamp == NOW + 10_000


def test_a_tier_record_is_due_one_delay_after_its_timestamp() -> None:
    assert due_timestamp_ms(NOW, 10_000) == NOW - 10_000
    assert due_time_ms(NOW - 10_000, 10_000) == NOW
    assert due_time_ms(tier_timestamp_ms(NOW + 5_000, 10_000, NOW), 10_000) == NOW + 5_000


def test_retry_after_beats_a_broad_non_retryable_class() -> None:
    d = run(policy(non_retryable=(Exception,)), 0, RetryAfter(10))
    assert d == RetryDecision(1, NOW + 10_000, NOW)


def test_retry_after_with_unsorted_delays_picks_largest_fitting_delay() -> None:
    delays = (30_000, 5_000, 10_000)
    d = run(policy(delays=delays), 0, RetryAfter(20))
    assert isinstance(d, RetryDecision) and d.tier == 2
    assert _readable_at(d, delays) == NOW + 20_000


# --- non-retryable -------------------------------------------------------------------------


class BadOrder(ValueError):
    pass


@pytest.mark.parametrize("attempt", [0, 1, 2, 3])
def test_non_retryable_dead_letters_regardless_of_attempts_left(attempt: int) -> None:
    assert run(policy(), attempt, NonRetryable("no")) == DeadLetterDecision("non_retryable")


def test_non_retryable_subclass_of_non_retryable() -> None:
    class Permanent(NonRetryable):
        pass

    assert run(policy(), 0, Permanent()) == DeadLetterDecision("non_retryable")


def test_configured_non_retryable_class_matches_subclasses() -> None:
    p = policy(non_retryable=(ValueError,))
    assert run(p, 0, BadOrder()) == DeadLetterDecision("non_retryable")
    assert run(p, 0, KeyError("k")) == RetryDecision(0, NOW + 1_000, NOW)


# --- from_names ----------------------------------------------------------------------------


def test_from_names_resolves_builtins_and_module_paths() -> None:
    p = RetryPolicy.from_names(
        [1_000, 2_500, 60_000],
        4,
        0.1,
        ["ValueError", "json:JSONDecodeError", "KeyboardInterrupt"],
        3_600_000,
    )
    assert p == RetryPolicy(
        delays_ms=(1_000, 2_500, 60_000),
        max_attempts=4,
        jitter=0.1,
        non_retryable=(ValueError, json.JSONDecodeError, KeyboardInterrupt),
    )


def test_from_names_resolves_a_class_in_a_test_module() -> None:
    p = RetryPolicy.from_names([1_000], 2, 0, [f"{__name__}:BadOrder"], 3_600_000)
    assert p.non_retryable == (BadOrder,)
    assert run(p, 0, BadOrder()) == DeadLetterDecision("non_retryable")


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("json:dumps", "is not an exception class"),
        ("len", "is not an exception class"),
        ("NoSuchError", "does not resolve"),
        ("no_such_module_xyz:Error", "does not resolve"),
        ("json:NoSuchError", "does not resolve"),
        ("json:", "does not resolve"),
    ],
)
def test_from_names_rejects_bad_entries_naming_them(name: str, why: str) -> None:
    with pytest.raises(ValueError, match=f"exception class '{name}' {why}"):
        RetryPolicy.from_names([1_000], 2, 0, [name], 3_600_000)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"max_attempts": 0}, "max_attempts must be >= 1"),
        ({"delays": (), "max_attempts": 2}, "delays_ms must name at least one delay"),
        ({"delays": (1_000, -1)}, "delays_ms must all be >= 0"),
        ({"jitter": -0.1}, "jitter must be a number from 0 to 1"),
        ({"jitter": 1.5}, "jitter must be a number from 0 to 1"),
        ({"jitter": float("nan")}, "jitter must be a number from 0 to 1"),
        ({"non_retryable": (int,)}, "non_retryable must hold exception classes"),
    ],
)
def test_policy_rejects_out_of_range_values(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        policy(**kwargs)


# --- is_due and describe_error -------------------------------------------------------------


@pytest.mark.parametrize(("now", "due"), [(NOW - 1, False), (NOW, True), (NOW + 1, True)])
def test_is_due(now: int, due: bool) -> None:
    assert is_due(NOW, now) is due


def _raise(error: BaseException) -> BaseException:
    try:
        raise error
    except BaseException as e:
        return e


def test_describe_error_builtin() -> None:
    cls, message, trace = describe_error(_raise(ValueError("bad value")))
    assert cls == "builtins.ValueError"
    assert message == "bad value"
    assert trace.startswith("Traceback (most recent call last):")
    assert trace.rstrip().endswith("ValueError: bad value")


def test_describe_error_qualifies_module_and_nested_class() -> None:
    assert describe_error(BadOrder("x"))[0] == f"{__name__}.BadOrder"
    assert describe_error(json.JSONDecodeError("m", "doc", 0))[0] == "json.decoder.JSONDecodeError"


def test_describe_error_bounds_message_and_trace() -> None:
    _, message, trace = describe_error(_raise(RuntimeError("ß" * 10_000)))
    assert len(message.encode("utf-8")) <= MAX_ERROR_MESSAGE_BYTES
    assert len(trace.encode("utf-8")) <= MAX_STACK_TRACE_BYTES
    assert "truncated" in message and "truncated" in trace


def test_describe_error_survives_an_unprintable_error() -> None:
    class Unprintable(Exception):
        def __str__(self) -> str:
            raise RuntimeError("no")

    cls, message, trace = describe_error(_raise(Unprintable()))
    assert cls.endswith("Unprintable")
    assert message.startswith("<unprintable ") and message.endswith(".Unprintable>")
    assert trace


# --- retry.timeout and dead-letter routes ----------------------------------------------------


def test_a_failure_after_the_timeout_dead_letters_whatever_attempts_remain() -> None:
    p = RetryPolicy(delays_ms=DELAYS, max_attempts=10, jitter=0.0, timeout_ms=30_000)
    first = NOW - 30_000
    timed_out = decide(
        p, error=RuntimeError(), attempt=3, record_id="r", now_ms=NOW, first_failure_ms=first
    )
    assert timed_out == DeadLetterDecision("retry_timeout")
    within = decide(
        p, error=RuntimeError(), attempt=3, record_id="r", now_ms=NOW, first_failure_ms=first + 1
    )
    assert isinstance(within, RetryDecision)
    assert isinstance(
        decide(p, error=RuntimeError(), attempt=0, record_id="r", now_ms=NOW), RetryDecision
    )


def test_dead_letter_routes_pick_the_first_matching_class() -> None:
    p = RetryPolicy.from_names(
        [1_000],
        2,
        0,
        [],
        3_600_000,
        dead_letter_routes=[
            ("KeyError", "missing"),
            ("LookupError", "lookup"),
            ("ValueError", "bad"),
        ],
    )
    assert p.dead_letter_topic(KeyError(), "dlt") == "missing"
    assert p.dead_letter_topic(IndexError(), "dlt") == "lookup"
    assert p.dead_letter_topic(json.JSONDecodeError("m", "d", 0), "dlt") == "bad"
    assert p.dead_letter_topic(RuntimeError(), "dlt") == "dlt"
