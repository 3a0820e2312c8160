"""A delay router's decisions for one record (`task.forwarding`): when it was sent, where it goes,
and whether it waits longer."""

from __future__ import annotations

import dataclasses
import json
import time

import pytest

from retrylib.retry.outcomes import Reason
from retrylib.task import forwarding
from retrylib.task.forwarding import (
    Forward,
    ForwardingTask,
    Hold,
    NoDestination,
    destination,
    hold,
    sent_at_ms,
    too_far_ahead,
)
from retrylib.task.results import NOT_BEFORE_MS

TOPICS = frozenset({"orders", "payments", "retry_5s", "__consumer_offsets"})
DELAY_TOPICS = frozenset({"retry_5s"})  # a topic of the cluster too


@pytest.mark.parametrize(
    ("value", "ms"),
    [
        (b"1764000000", 1_764_000_000_000),
        (b" 1764000000\n", 1_764_000_000_000),  # `date +%s` through a shell keeps a newline
        (b"1764000000.25", 1_764_000_000_250),
        (b"1764000000.123456", 1_764_000_000_123),
        (b"1764000000.", 1_764_000_000_000),
        (b"0", 0),
    ],
)
def test_sent_at_reads_epoch_seconds(value: bytes, ms: int) -> None:
    assert sent_at_ms(value) == ms


@pytest.mark.parametrize(
    "value", [None, b"", b"soon", b"-5", b"1764000000000000", b"1.2.3", b"\xff", b"1e9"]
)
def test_sent_at_is_none_for_what_is_not_epoch_seconds(value: bytes | None) -> None:
    assert sent_at_ms(value) is None


def test_a_named_topic_of_the_cluster_is_the_destination() -> None:
    assert destination(b"orders", "final_topic", TOPICS, DELAY_TOPICS) == Forward("orders")


@pytest.mark.parametrize(
    ("target", "reason", "message"),
    [
        (None, Reason.NO_FINAL_TOPIC, "the record has no final_topic header"),
        (b"nope", Reason.UNKNOWN_FINAL_TOPIC, 'final_topic "nope" is not a topic of the cluster'),
        (b"", Reason.UNKNOWN_FINAL_TOPIC, 'final_topic "" is not a topic of the cluster'),
        (b"__consumer_offsets", Reason.UNKNOWN_FINAL_TOPIC, '"__consumer_offsets" is not a topic'),
        (b"ord\xffers", Reason.UNKNOWN_FINAL_TOPIC, '"ord\\ufffders" is not a topic'),
        (b"retry_5s", Reason.DELAY_FINAL_TOPIC, '"retry_5s" is one of this router\'s delay topics'),
    ],
)
def test_no_destination_says_why(target: bytes | None, reason: Reason, message: str) -> None:
    found = destination(target, "final_topic", TOPICS, DELAY_TOPICS)
    assert isinstance(found, NoDestination)
    assert found.reason == reason
    assert message in found.message


def test_a_record_is_due_once_sent_at_plus_delay_has_passed() -> None:
    assert hold(sent_ms=10_000, delay_ms=5_000, now_ms=15_000) is None
    assert hold(sent_ms=10_000, delay_ms=5_000, now_ms=20_000) is None


def test_a_record_not_due_is_stamped_to_be_released_when_due() -> None:
    # Sent at 10 s but stamped by Kafka at 9 s: released at 14 s, due at 15 s.
    assert hold(sent_ms=10_000, delay_ms=5_000, now_ms=14_000) == Hold(10_000)


def test_a_sender_clock_ahead_of_now_is_never_stamped_in_the_future() -> None:
    # Sent "at" 100 s by a clock 86 s ahead: stamped now, so it comes round again after
    # one delay, and again until it is due.
    assert hold(sent_ms=100_000, delay_ms=5_000, now_ms=14_000) == Hold(14_000)
    assert hold(sent_ms=100_000, delay_ms=5_000, now_ms=104_000) == Hold(100_000)
    assert hold(sent_ms=100_000, delay_ms=5_000, now_ms=105_000) is None


def test_a_record_due_within_the_read_ahead_is_released_not_held() -> None:
    assert hold(sent_ms=10_000, delay_ms=5_000, now_ms=14_000, read_ahead_ms=1_000) is None
    assert hold(sent_ms=10_000, delay_ms=5_000, now_ms=13_000, read_ahead_ms=1_000) == Hold(10_000)


def test_a_record_sent_further_ahead_than_the_bound_has_no_destination(forward_plan) -> None:
    plan = dataclasses.replace(forward_plan, now_ms=10_000, max_timestamp_ahead_ms=3_600_000)
    assert too_far_ahead(3_610_000, plan) is None  # a clock an hour ahead still waits
    assert too_far_ahead(10_000 + 2 * 86_400_000, plan) == NoDestination(
        Reason.TIMESTAMP_TOO_FAR_AHEAD,
        "msg_ts is 2d ahead of the router's clock, more than delay_router.max_timestamp_ahead (1h)",
    )


class Message:
    """A delay topic's record as confluent-kafka's consumer gives it, sent at `sent_ms`."""

    def __init__(self, offset: int, sent_ms: int) -> None:
        self._offset, self._sent_ms = offset, sent_ms

    def offset(self) -> int:
        return self._offset

    def key(self) -> bytes:
        return b"k"

    def value(self) -> bytes:
        return b"v"

    def headers(self) -> list:
        return [("final_topic", b"orders"), ("msg_ts", f"{self._sent_ms / 1000:.3f}".encode())]

    def timestamp(self) -> tuple[int, int]:
        return (1, self._sent_ms)


def test_a_task_that_released_a_record_read_ahead_says_when_it_is_due_without_waiting(
    monkeypatch, forward_plan
) -> None:
    now_ms = int(time.time() * 1000)
    due_ms = now_ms + 60_000
    messages = [Message(0, now_ms - 5_000), Message(1, due_ms - 1_000)]
    monkeypatch.setattr(forwarding, "read_messages", lambda part, lost: iter([messages]))
    monkeypatch.setattr(ForwardingTask, "_cluster", lambda self: frozenset({"orders"}))
    plan = dataclasses.replace(forward_plan, now_ms=now_ms, read_ahead_ms=60_000)
    task = ForwardingTask(plan)

    task.forward_range("delays", 0, 0, 2)
    rows = [row for batch in task.finish() for row in batch.to_pylist()]

    # The batch's produce waits for it (never early), overlapping its staging and set-up.
    assert time.time() * 1000 < due_ms
    counters = json.loads(next(row["counters"] for row in rows if row["kind"] == "counters"))
    assert counters[NOT_BEFORE_MS] == due_ms
    # Each forwarded record is stamped no earlier than it is due.
    stamps = [row["staged"]["timestamp_ms"] for row in rows if row["kind"] == "staged"]
    assert stamps == [now_ms, due_ms]
    assert counters["forwarded"] == 2 and "requeued_not_due" not in counters


def test_a_task_that_released_only_due_records_sets_no_time(monkeypatch, forward_plan) -> None:
    now_ms = int(time.time() * 1000)
    monkeypatch.setattr(
        forwarding, "read_messages", lambda part, lost: iter([[Message(0, now_ms - 5_000)]])
    )
    monkeypatch.setattr(ForwardingTask, "_cluster", lambda self: frozenset({"orders"}))
    task = ForwardingTask(dataclasses.replace(forward_plan, now_ms=now_ms, read_ahead_ms=2_000))

    task.forward_range("delays", 0, 0, 1)
    [counters] = [r["counters"] for b in task.finish() for r in b.to_pylist() if r["counters"]]

    assert NOT_BEFORE_MS not in json.loads(counters)
