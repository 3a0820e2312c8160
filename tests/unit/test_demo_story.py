"""The demo's console line for a batch: its counters in words."""

from __future__ import annotations

from retrylib.dev.demo import batch_story


def test_a_batch_is_told_by_what_it_read_and_where_each_record_went() -> None:
    counters = {
        "records_main": 200,
        "succeeded": 165,
        "retried_tier_1": 34,
        "dead_lettered": 1,
        "handler_ms": 2,
        "kafka_read_ms": 307,
    }
    story = "200 new orders read; 165 handled, 34 sent to retry tier 1, 1 dead-lettered"
    assert batch_story(counters) == story


def test_retries_name_their_tier_counted_from_one_and_skip_tiers_not_used() -> None:
    counters = {"records_retry": 34, "records_main": 2, "succeeded": 15, "retried_tier_2": 21}
    story = "2 new orders read and 34 retries read; 15 handled, 21 sent to retry tier 2"
    assert batch_story(counters) == story


def test_a_batch_that_read_nothing_is_not_told() -> None:
    assert batch_story({"handler_ms": 0, "kafka_read_ms": 382}) == ""
