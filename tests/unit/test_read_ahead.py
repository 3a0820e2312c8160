"""Retries read ahead of their due time wait in their task (retrylib.task.read_ahead); no Spark.

The clock is a fake that the fake sleep moves on."""

from __future__ import annotations

from retrylib.record import Record
from retrylib.task.read_ahead import DueClock, WaitingRetries
from retrylib.task.retry_records import Delivery


class Wall:
    def __init__(self) -> None:
        self.now_ms = 1_000
        self.slept_ms: list[float] = []

    def time(self) -> float:
        return self.now_ms / 1000

    def sleep(self, seconds: float) -> None:
        self.slept_ms.append(seconds * 1000)
        self.now_ms += seconds * 1000

    def clock(self, batch_now_ms: int = 0) -> DueClock:
        return DueClock(batch_now_ms, self.time, self.sleep)


def retry(key: bytes, offset: int, due_ms: int) -> Delivery:
    record = Record(key, b"v", [], "orders", 0, offset, 0, 1)
    return Delivery(record, "orders.retry.5s", "job", f"id-{offset}", None, due_ms)


def test_a_due_retry_does_not_wait_unless_an_earlier_one_of_its_key_does() -> None:
    clock, waiting = Wall().clock(), WaitingRetries()
    assert not waiting.must_wait(retry(b"a", 1, 900), clock)
    assert waiting.must_wait(retry(b"a", 2, 1_500), clock)
    assert waiting.must_wait(retry(b"a", 3, 900), clock)  # behind offset 2
    assert not waiting.must_wait(retry(b"b", 4, 1_000), clock)


def test_what_is_due_by_the_batch_start_is_due_though_the_wall_clock_is_behind() -> None:
    wall = Wall()
    clock = wall.clock(batch_now_ms=1_500)
    assert not WaitingRetries().must_wait(retry(b"a", 1, 1_400), clock)
    clock.sleep_until(1_500)
    assert wall.slept_ms == []
    clock.sleep_until(1_700)
    assert wall.slept_ms == [200]


def test_waiting_retries_come_as_they_fall_due_earliest_first_each_key_in_order() -> None:
    wall, waiting = Wall(), WaitingRetries()
    clock = wall.clock()
    for delivery in (
        retry(b"a", 1, 1_800),
        retry(b"a", 2, 1_200),  # due before offset 1, handled after it
        retry(b"b", 3, 1_300),
        retry(b"c", 4, 1_300),
    ):
        assert waiting.must_wait(delivery, clock)

    runs = [(wall.now_ms, [d.record.offset for d in run]) for run in waiting.runs(clock)]

    assert runs == [(1_300, [3, 4]), (1_800, [1, 2])]
    assert wall.slept_ms == [300, 500]
    assert list(waiting.runs(clock)) == []  # emptied
