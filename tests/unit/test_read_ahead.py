"""Retries read ahead of their due time wait in their task (retrylib.read_ahead); no Spark.

The clock is a fake that the fake sleep moves on."""

from __future__ import annotations

from retrylib.read_ahead import WaitingRetries
from retrylib.record import Record
from retrylib.retry_records import Delivery


class Clock:
    def __init__(self) -> None:
        self.now_ms = 1_000
        self.slept_ms: list[float] = []

    def ms_until(self, due_ms: int) -> float:
        return due_ms - self.now_ms

    def sleep(self, seconds: float) -> None:
        self.slept_ms.append(seconds * 1000)
        self.now_ms += seconds * 1000


def retry(key: bytes, offset: int, due_ms: int) -> Delivery:
    record = Record(key, b"v", [], "orders", 0, offset, 0, 1)
    return Delivery(record, "orders.retry.5s", "job", f"id-{offset}", None, due_ms)


def test_a_due_retry_does_not_wait_unless_an_earlier_one_of_its_key_does() -> None:
    clock, waiting = Clock(), WaitingRetries()
    assert not waiting.must_wait(retry(b"a", 1, 900), clock.ms_until)
    assert waiting.must_wait(retry(b"a", 2, 1_500), clock.ms_until)
    assert waiting.must_wait(retry(b"a", 3, 900), clock.ms_until)  # behind offset 2
    assert not waiting.must_wait(retry(b"b", 4, 1_000), clock.ms_until)


def test_waiting_retries_come_as_they_fall_due_earliest_first_each_key_in_order() -> None:
    clock, waiting = Clock(), WaitingRetries()
    for delivery in (
        retry(b"a", 1, 1_800),
        retry(b"a", 2, 1_200),  # due before offset 1, handled after it
        retry(b"b", 3, 1_300),
        retry(b"c", 4, 1_300),
    ):
        assert waiting.must_wait(delivery, clock.ms_until)

    runs = [
        (clock.now_ms, [d.record.offset for d in run])
        for run in waiting.runs(clock.ms_until, clock.sleep)
    ]

    assert runs == [(1_300, [3, 4]), (1_800, [1, 2])]
    assert clock.slept_ms == [300, 500]
    assert list(waiting.runs(clock.ms_until, clock.sleep)) == []  # emptied
