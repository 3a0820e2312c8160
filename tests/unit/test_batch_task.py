"""The executor side of a batch, driven with Arrow batches directly (no Spark, no Kafka)."""

from __future__ import annotations

import dataclasses
import gc
import time

import pytest
from helpers import TIER, outgoing_headers, route

from retrylib.retry.headers import (
    RetryState,
    decode_retry_state,
    encode_retry_headers,
    is_signed_by,
    sign,
    split_headers,
)
from retrylib.task.plan import TaskPlan
from retrylib.task.results import OUTGOING_KIND


def retry_row(
    plan: TaskPlan,
    key: bytes,
    offset: int,
    attempt: int = 1,
    not_before_ms: int = 0,
    *,
    record_id: str = "r1",
    job: str = "job",
    signing_key: bytes | None = None,
) -> dict:
    """A record on tier TIER as the job writes it (signed with the plan's key unless given)."""
    state = RetryState(
        job, record_id, attempt, not_before_ms, "orders", 2, 17, 1000, 1, 2, "E", "m"
    )
    headers = sign(
        encode_retry_headers([("trace", b"t1")], state),
        signing_key=plan.signing_key if signing_key is None else signing_key,
        topic=TIER,
        key=key,
        value=b"v",
    )
    return {"key": key, "topic": TIER, "offset": offset, "headers": headers}


def is_signed(plan: TaskPlan, outgoing: dict) -> bool:
    return is_signed_by(
        outgoing_headers(outgoing),
        signing_key=plan.signing_key,
        topic=outgoing["topic"],
        key=outgoing["key"],
        value=outgoing["value"],
    )


def test_success_writes_output_rows(plan):
    counters, written = route(plan, [{"key": b"ok-1", "offset": 5}, {"key": b"none", "offset": 6}])
    assert written["output"] == [{"key": "ok-1", "topic": "orders", "offset": 5, "attempt": 0}]
    assert counters["succeeded"] == 2 and counters["records_main"] == 2


def test_failure_goes_to_first_tier_never_early(plan):
    before = int(time.time() * 1000)
    counters, written = route(plan, [{"key": b"fail-1", "offset": 9, "headers": [("h", b"x")]}])
    [outgoing] = written[OUTGOING_KIND]
    assert (outgoing["topic"], outgoing["partition"]) == (TIER, 1)
    user, own = split_headers([(h["key"], h["value"]) for h in outgoing["headers"]])
    state = decode_retry_state(own)
    assert user == [("h", b"x")]
    assert (state.attempt, state.origin_offset, state.error_class) == (
        1,
        9,
        "builtins.RuntimeError",
    )
    assert state.not_before_ms >= before + 5000
    assert outgoing["timestamp_ms"] == state.not_before_ms - 5000
    assert counters["retried_tier_1"] == 1


def test_non_retryable_goes_to_dead_letter(plan):
    counters, written = route(plan, [{"key": b"stop-1", "offset": 3}])
    [dead] = written["dead_letter"]
    assert (dead["reason"], dead["attempts"], dead["error_class"]) == (
        "non_retryable",
        1,
        "retrylib.errors.NonRetryable",
    )
    assert [s["topic"] for s in written[OUTGOING_KIND]] == ["orders.dlt"]
    assert counters["dead_lettered"] == 1
    assert counters["main_failed"] == 1  # what [breaker] watches: main-topic records only


def test_retry_record_is_handed_over_as_the_original(plan):
    rows = [retry_row(plan, b"ok-2", 40)]
    counters, written = route(plan, rows)
    assert written["output"] == [{"key": "ok-2", "topic": "orders", "offset": 17, "attempt": 1}]
    assert counters["records_retry"] == 1


def test_a_handled_retry_reports_how_late_it_was_and_a_requeued_one_does_not(plan):
    due = int(time.time() * 1000) - 1500
    rows = [
        retry_row(plan, b"ok-late", 40, not_before_ms=due),
        retry_row(plan, b"ok-early", 41, not_before_ms=plan.now_ms + 60_000, record_id="r2"),
    ]
    before = int(time.time() * 1000)
    _, written = route(plan, rows)
    after = int(time.time() * 1000)
    [lateness] = written["lateness"]
    assert lateness["tier"] == 0
    assert before - due <= lateness["lateness_ms"] <= after - due


def test_retries_read_ahead_are_handled_once_due_after_the_due_ones(plan):
    plan = dataclasses.replace(plan, now_ms=int(time.time() * 1000), read_ahead_ms=2000)
    soon, later = plan.now_ms + 300, plan.now_ms + 700
    rows = [
        retry_row(plan, b"ok-later", 40, not_before_ms=later),
        retry_row(plan, b"ok-now", 41, not_before_ms=plan.now_ms - 10, record_id="r2"),
        retry_row(plan, b"ok-soon", 42, not_before_ms=soon, record_id="r3"),
        retry_row(plan, b"ok-past", 43, not_before_ms=plan.now_ms + 5000, record_id="r4"),
    ]
    counters, written = route(plan, rows)
    assert time.time() * 1000 >= later  # the task waited for the later one to be due
    # The due one first; the others as they fell due, not in the order read.
    assert [row["key"] for row in written["output"]] == ["ok-now", "ok-soon", "ok-later"]
    # Each was handed over once due, not when the last one was: lateness stays small.
    assert all(0 <= row["lateness_ms"] < 250 for row in written["lateness"]), written["lateness"]
    assert counters["requeued_not_due"] == 1  # past the read-ahead: back to its tier
    assert [outgoing["key"] for outgoing in written[OUTGOING_KIND]] == [b"ok-past"]


def test_a_vectorised_call_takes_its_retries_once_the_last_is_due(plan):
    plan = dataclasses.replace(plan, now_ms=int(time.time() * 1000), read_ahead_ms=2000)
    due = plan.now_ms + 400
    rows = [retry_row(plan, b"ok-a", 40, not_before_ms=due)]
    _, written = route(vectorised(plan, "arrow_rows"), rows)
    assert time.time() * 1000 >= due
    assert [row["key"] for row in written["output"]] == ["ok-a"]


def test_last_attempt_failure_is_dead_lettered_as_exhausted(plan):
    rows = [retry_row(plan, b"fail-2", 41, attempt=2)]
    counters, written = route(plan, rows)
    assert "main_failed" not in counters
    [dead] = written["dead_letter"]
    assert (dead["reason"], dead["attempts"], dead["origin_offset"]) == (
        "attempts_exhausted",
        3,
        17,
    )
    assert dead["headers"] == [{"key": "trace", "value": b"t1"}]


@pytest.mark.parametrize("kind", ["record", "arrow"])
def test_a_retry_past_a_lowered_max_attempts_is_dead_lettered_without_a_call(plan, kind):
    """retry.max_attempts lowered from 3 to 2 while a record waited for its third call."""
    plan = dataclasses.replace(plan, max_attempts=2)
    if kind == "arrow":
        plan = vectorised(plan, "arrow_rows")
    rows = [retry_row(plan, b"ok-7", 44, attempt=2), retry_row(plan, b"ok-8", 45, record_id="r2")]
    counters, written = route(plan, rows)
    assert [row["key"] for row in written["output"]] == ["ok-8"]  # one call left: made
    [dead] = written["dead_letter"]
    assert (dead["reason"], dead["attempts"], dead["origin_offset"]) == (
        "attempts_exhausted",
        2,
        17,
    )
    assert "retry.max_attempts is 2" in dead["error_message"] and "E: m" in dead["error_message"]
    assert counters["dead_lettered"] == 1


def test_corrupt_retry_headers_are_dead_lettered(plan):
    headers = sign(
        [("retrylib.id", b"x")], signing_key=plan.signing_key, topic=TIER, key=b"ok-3", value=b"v"
    )
    rows = [{"key": b"ok-3", "topic": TIER, "offset": 42, "headers": headers}]
    _, written = route(plan, rows)
    [dead] = written["dead_letter"]
    assert (dead["reason"], dead["attempts"], dead["source_topic"]) == (
        "corrupt_retry_headers",
        0,
        TIER,
    )


def test_duplicate_retry_in_one_task_is_skipped(plan):
    rows = [retry_row(plan, b"ok-4", o) for o in (50, 51)]
    counters, written = route(plan, rows)
    assert len(written["output"]) == 1 and counters["duplicates_skipped"] == 1


def test_retry_not_yet_due_is_requeued_not_handled(plan):
    not_before = plan.now_ms + 60_000
    rows = [retry_row(plan, b"ok-5", 60, not_before_ms=not_before)]
    counters, written = route(plan, rows)
    assert written["output"] == [] and counters["requeued_not_due"] == 1
    [outgoing] = written[OUTGOING_KIND]
    # At most one delay ahead of now: a later timestamp would hold back the tier behind it.
    assert (outgoing["topic"], outgoing["timestamp_ms"]) == (TIER, plan.now_ms + 5000)
    assert outgoing_headers(outgoing) == rows[0]["headers"] and is_signed(plan, outgoing)


def test_rows_that_do_not_fit_the_schema_dead_letter_only_their_record(plan):
    rows = [{"key": b"ok-6", "offset": 1}, {"key": b"wrongtype", "offset": 2}]
    counters, written = route(plan, rows)
    assert [r["key"] for r in written["output"]] == ["ok-6"]
    [dead] = written["dead_letter"]
    assert (dead["reason"], dead["attempts"]) == ("bad_handler_result", 1)
    assert dead["error_class"].endswith("BadHandlerResult")
    assert counters["succeeded"] == 1 and counters["dead_lettered"] == 1
    assert "retried_tier_1" not in counters


def vectorised(plan: TaskPlan, handler: str, kind: str = "arrow") -> TaskPlan:
    return dataclasses.replace(plan, handler=f"unit_handlers:{handler}", handler_kind=kind)


@pytest.mark.parametrize(
    ("handler", "kind"), [("arrow_table", "arrow"), ("pandas_frame", "pandas")]
)
def test_vectorised_frame_result_is_written_whole(plan, handler, kind):
    rows = [{"key": f"ok-{i}".encode(), "offset": i} for i in range(5)]
    counters, written = route(vectorised(plan, handler, kind), rows)
    assert sorted(r["key"] for r in written["output"]) == [f"ok-{i}" for i in range(5)]
    assert counters["succeeded"] == 5 and counters["records_main"] == 5


def test_vectorised_per_row_results_fail_only_their_rows(plan):
    rows = [{"key": b"ok-1", "offset": 1}, {"key": b"fail-2", "offset": 2}]
    counters, written = route(vectorised(plan, "arrow_rows"), rows)
    assert [r["key"] for r in written["output"]] == ["ok-1"]
    assert [s["topic"] for s in written[OUTGOING_KIND]] == [TIER]
    assert counters["succeeded"] == 1 and counters["retried_tier_1"] == 1


def test_vectorised_call_that_raises_fails_every_row(plan):
    rows = [{"key": f"ok-{i}".encode(), "offset": i} for i in range(3)]
    counters, written = route(vectorised(plan, "arrow_raises"), rows)
    assert written["output"] == [] and counters["retried_tier_1"] == 3


def test_vectorised_batch_with_retries_passes_the_original(plan):
    rows = [retry_row(plan, b"ok-7", 40)]
    _, written = route(vectorised(plan, "arrow_table"), rows)
    assert written["output"] == [{"key": "ok-7", "topic": "orders", "offset": 17, "attempt": 1}]


def test_vectorised_batch_of_only_duplicate_retries_is_counted_once(plan):
    rows = [retry_row(plan, b"ok-8", o) for o in (70, 71)]
    counters, written = route(vectorised(plan, "arrow_rows"), rows)
    assert len(written["output"]) == 1
    assert (counters["records_retry"], counters["duplicates_skipped"]) == (2, 1)


def test_vectorised_batch_with_nothing_due_calls_no_handler(plan):
    not_before = plan.now_ms + 60_000
    rows = [retry_row(plan, b"ok-9", 80, not_before_ms=not_before)]
    counters, written = route(vectorised(plan, "arrow_raises"), rows)
    assert written["output"] == [] and counters["requeued_not_due"] == 1
    assert counters["records_retry"] == 1 and "retried_tier_1" not in counters


def test_the_collector_thresholds_come_back_after_a_task(plan):
    before = gc.get_threshold()
    route(plan, [{"key": b"ok-1", "offset": 1}])
    assert gc.get_threshold() == before


# --- records the job did not write ----------------------------------------------------------


@pytest.mark.parametrize("kind", ["record", "arrow"])
def test_a_forged_retry_never_shadows_the_genuine_one(plan, kind):
    forged = retry_row(plan, b"ok-forged", 90, signing_key=b"x" * 32)
    unsigned = {
        **retry_row(plan, b"ok-plain", 91),
        "headers": retry_row(plan, b"ok", 0)["headers"][:-1],
    }
    genuine = retry_row(plan, b"ok-genuine", 92)  # same id and attempt as both forgeries
    handler = "by_key" if kind == "record" else "arrow_table"
    counters, written = route(vectorised(plan, handler, kind), [forged, unsigned, genuine])
    assert [r["key"] for r in written["output"]] == ["ok-genuine"]
    assert "duplicates_skipped" not in counters
    dead = written["dead_letter"]
    assert [(d["origin_offset"], d["reason"]) for d in dead] == [
        (90, "unverified_retry_record"),
        (91, "unverified_retry_record"),
    ]
    assert all(d["error_class"] == "retrylib.errors.UnverifiedRetryRecord" for d in dead)
    assert [d["key"] for d in dead] == [b"ok-forged", b"ok-plain"]
    assert all(s["topic"] == "orders.dlt" and is_signed(plan, s) for s in written[OUTGOING_KIND])


def test_a_record_moved_to_another_tier_is_not_verified(plan):
    row = {**retry_row(plan, b"ok-moved", 93), "topic": "orders.retry.1m"}
    counters, written = route(plan, [row])
    assert written["output"] == []
    assert [d["reason"] for d in written["dead_letter"]] == ["unverified_retry_record"]


def test_another_jobs_retry_is_skipped_and_counted(plan):
    row = retry_row(plan, b"ok-theirs", 94, job="neighbour", signing_key=b"n" * 32)
    counters, written = route(plan, [row])
    assert not any(written.values())
    assert counters["skipped_other_job"] == 1 and counters["records_retry"] == 1


def test_retries_and_dead_letters_are_signed_for_their_topic(plan):
    _, written = route(plan, [{"key": b"fail-1", "offset": 9}, {"key": b"stop-1", "offset": 10}])
    assert sorted(s["topic"] for s in written[OUTGOING_KIND]) == ["orders.dlt", TIER]
    assert all(is_signed(plan, s) for s in written[OUTGOING_KIND])
    assert all(
        split_headers(outgoing_headers(s))[1]["retrylib.job"] == b"job"
        for s in written[OUTGOING_KIND]
    )


# --- reserved headers on main topics ----------------------------------------------------------


@pytest.mark.parametrize("kind", ["record", "arrow"])
def test_reserved_headers_on_a_main_record_are_taken_off_and_others_kept(plan, kind):
    headers = [
        ("retrylib.id", b"forged"),
        ("retrylib.x", b"mine"),
        ("h", None),
        ("retrylib.attempt", b"9"),
    ]
    handler = "by_key" if kind == "record" else "arrow_rows"
    counters, written = route(
        vectorised(plan, handler, kind), [{"key": b"fail-h", "offset": 7, "headers": headers}]
    )
    assert counters["reserved_headers_removed"] == 2
    [outgoing] = written[OUTGOING_KIND]
    user, own = split_headers(outgoing_headers(outgoing))
    assert user == [("retrylib.x", b"mine"), ("h", None)]
    state = decode_retry_state(own)
    assert (state.attempt, state.origin_offset) == (1, 7)
    assert state.id != "forged"


def test_the_handler_never_sees_reserved_headers(plan):
    headers = [("retrylib.signature", b"00"), ("retrylib.xy", b"1")]
    _, written = route(plan, [{"key": b"headers", "offset": 8, "headers": headers}])
    [outgoing] = written[OUTGOING_KIND]
    state = decode_retry_state(split_headers(outgoing_headers(outgoing))[1])
    assert state.error_message == repr([("retrylib.xy", b"1")])


# --- what a handler may ask for --------------------------------------------------------------


@pytest.mark.parametrize("seconds", ["1e17", "inf", "3601"])
def test_a_retry_after_beyond_the_maximum_is_dead_lettered_not_a_crash(plan, seconds):
    counters, written = route(plan, [{"key": f"after-{seconds}".encode(), "offset": 11}])
    [dead] = written["dead_letter"]
    assert (dead["reason"], dead["error_class"]) == (
        "retry_after_too_long",
        "retrylib.errors.RetryAfter",
    )
    assert counters["dead_lettered"] == 1


def test_a_retry_after_nan_is_an_ordinary_retry(plan):
    counters, written = route(plan, [{"key": b"after-nan", "offset": 12}])
    assert counters["retried_tier_1"] == 1


def test_a_long_retry_after_waits_in_hops_never_holding_the_tier(plan):
    before = int(time.time() * 1000)
    _, written = route(plan, [{"key": b"after-3000", "offset": 13}])
    [outgoing] = written[OUTGOING_KIND]
    state = decode_retry_state(split_headers(outgoing_headers(outgoing))[1])
    assert outgoing["topic"] == "orders.retry.1m"
    assert state.not_before_ms >= before + 3_000_000
    after = int(time.time() * 1000)
    assert outgoing["timestamp_ms"] <= after + 60_000


# --- skip, routes, timeout -----------------------------------------------------------------


def test_skip_drops_the_record_with_a_count(plan):
    counters, written = route(plan, [{"key": b"skip-1", "offset": 14}])
    assert not any(written.values())
    assert counters["skipped_by_handler"] == 1


def test_dead_letters_go_to_the_topic_routed_for_their_error(plan):
    routed = dataclasses.replace(
        plan,
        dead_letter_routes=(("retrylib.errors:NonRetryable", "orders.stopped.dlt"),),
        partition_counts={**plan.partition_counts, "orders.stopped.dlt": 1},
    )
    rows = [{"key": b"stop-1", "offset": 15}, retry_row(plan, b"fail-3", 16, attempt=2)]
    _, written = route(routed, rows)
    assert sorted(s["topic"] for s in written[OUTGOING_KIND]) == [
        "orders.dlt",
        "orders.stopped.dlt",
    ]
    assert all(is_signed(plan, s) for s in written[OUTGOING_KIND])
    assert len(written["dead_letter"]) == 2


def test_a_retry_past_the_timeout_is_dead_lettered(plan):
    timed = dataclasses.replace(plan, max_attempts=10, retry_timeout_ms=1)
    _, written = route(timed, [retry_row(plan, b"fail-4", 17, attempt=1)])
    [dead] = written["dead_letter"]
    assert (dead["reason"], dead["attempts"]) == ("retry_timeout", 2)
