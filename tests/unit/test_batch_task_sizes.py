"""The executor side with topic size limits: too-large retry copies and dead-letter records."""

from __future__ import annotations

import dataclasses

import pytest
from helpers import TIER, route

from retrylib.kafka.record_size import wire_size
from retrylib.retry import headers as h
from retrylib.task.plan import TaskPlan
from retrylib.task.results import OUTGOING_KIND

TIER_LIMIT, DEAD_LETTER_LIMIT = 20_000, 18_000


@pytest.fixture
def sized(plan: TaskPlan) -> TaskPlan:
    limits = {TIER: TIER_LIMIT, "orders.retry.1m": TIER_LIMIT, "orders.dlt": DEAD_LETTER_LIMIT}
    return dataclasses.replace(plan, max_record_bytes=limits)


def _headers(outgoing: dict) -> list[tuple[str, bytes]]:
    return [(header["key"], header["value"]) for header in outgoing["headers"]]


def test_a_retry_copy_over_the_tier_limit_is_dead_lettered_and_the_batch_goes_on(sized, caplog):
    big = bytes(range(256)) * 100  # 25,600 bytes: fits no topic here once headers are added
    rows = [
        {"key": b"fail-big", "offset": 7, "value": big, "headers": [("trace", b"t1")]},
        {"key": b"fail-small", "offset": 8},
        {"key": b"ok-1", "offset": 9},
    ]
    counters, written = route(sized, rows)

    assert [r["key"] for r in written["output"]] == ["ok-1"]
    [dead] = written["dead_letter"]
    assert (dead["reason"], dead["origin_offset"], dead["attempts"]) == ("record_too_large", 7, 1)
    assert (dead["key"], dead["value"]) == (b"fail-big", big)  # in full in the table
    assert dead["headers"] == [{"key": "trace", "value": b"t1"}]
    assert dead["error_class"] == "builtins.RuntimeError"  # the handler's error is kept

    by_topic = {outgoing["topic"]: outgoing for outgoing in written[OUTGOING_KIND]}
    assert sorted(by_topic) == ["orders.dlt", TIER]  # the small failure is retried as usual
    on_topic = by_topic["orders.dlt"]
    produced = _headers(on_topic)
    assert (h.VALUE_TRUNCATED, str(len(big)).encode()) in produced
    assert (h.DEAD_LETTER_REASON, b"record_too_large") in produced
    assert ("trace", b"t1") in produced
    assert big.startswith(on_topic["value"]) and on_topic["value"]
    assert wire_size(on_topic["key"], on_topic["value"], produced) <= DEAD_LETTER_LIMIT

    assert counters["dead_lettered_too_large"] == 1
    assert counters["dead_lettered"] == 1
    assert counters["dead_letter_truncated"] == 1
    assert counters["retried_tier_1"] == 1
    assert "orders[1]@7: retry copy of" in caplog.text and f"{TIER_LIMIT} bytes" in caplog.text


def test_a_dead_letter_record_over_the_topic_limit_is_cut_on_the_topic_only(sized, caplog):
    big = b"x" * 19_000  # would fit the tier, not the dead-letter topic
    counters, written = route(sized, [{"key": b"stop-big", "offset": 3, "value": big}])
    [dead] = written["dead_letter"]
    assert (dead["reason"], dead["value"]) == ("non_retryable", big)
    [on_topic] = written[OUTGOING_KIND]
    assert (h.VALUE_TRUNCATED, b"19000") in _headers(on_topic)
    assert wire_size(on_topic["key"], on_topic["value"], _headers(on_topic)) <= DEAD_LETTER_LIMIT
    assert counters["dead_letter_truncated"] == 1
    assert "dead_lettered_too_large" not in counters
    assert "orders[1]@3: dead-letter record of" in caplog.text


def test_records_within_the_limits_go_out_unchanged(sized):
    value = b"v" * 10_000
    counters, written = route(
        sized,
        [{"key": b"fail-1", "offset": 1, "value": value}, {"key": b"stop-1", "offset": 2}],
    )
    assert [s["value"] for s in written[OUTGOING_KIND]] == [value, b"v"]
    assert all(not n.endswith("_truncated") for s in written[OUTGOING_KIND] for n, _ in _headers(s))
    assert "dead_letter_truncated" not in counters and "dead_lettered_too_large" not in counters
