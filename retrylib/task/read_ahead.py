"""Retries read ahead of their due time (`retry.read_ahead`), waiting in their task.

A routing task hands the handler every retry that is due as it reads them. One that is not
due yet waits here, and so do the later ones of its key, since a key's records are handled
in the order read. Once the task has read everything else, the waiting retries are handed
over as they fall due, earliest first: a record read ahead never holds back a due record
of another key, nor the rest of the task's partitions.
"""

from __future__ import annotations

import heapq
import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from retrylib.retry.wall_clock import sleep_until

if TYPE_CHECKING:
    from retrylib.task.retry_records import Delivery


class DueClock:
    """The clock a task waits on for what it read ahead: the wall clock, never behind the
    batch's start (`now_ms`), since what the batch counted as due by then is due."""

    def __init__(
        self,
        batch_now_ms: int,
        wall_s: Callable[[], float] = time.time,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self._batch_now_ms = batch_now_ms
        self._wall_s = wall_s
        self._sleep = sleep

    def now_ms(self) -> float:
        """Now, in epoch milliseconds, by this clock."""
        return max(self._batch_now_ms, self._wall_s() * 1000)

    def ms_until(self, due_ms: int) -> float:
        """How long until `due_ms`; zero or less once it is due."""
        return due_ms - self.now_ms()

    def sleep_until(self, due_ms: int) -> None:
        """Return once `due_ms` is due."""
        sleep_until(due_ms, self.now_ms(), self._sleep)


class WaitingRetries:
    """The retries of one task that wait to be due, a queue per key in the order read."""

    def __init__(self) -> None:
        self._queues: dict[bytes | None, deque[Delivery]] = {}

    def must_wait(self, delivery: Delivery, clock: DueClock) -> bool:
        """Whether `delivery` waits here: it is not due yet by `clock`, or an earlier record
        of its key waits. Adds it when so."""
        key = delivery.record.key
        if key not in self._queues and clock.ms_until(_due(delivery)) <= 0:
            return False
        self._queues.setdefault(key, deque()).append(delivery)
        return True

    def runs(self, clock: DueClock) -> Iterator[list[Delivery]]:
        """Every waiting retry, in runs of those due at once, each run after sleeping until
        its first is due; earliest due first, a key's in the order read. Empties the queues."""
        queues = list(self._queues.values())
        self._queues = {}
        heads = [(_due(queue[0]), index) for index, queue in enumerate(queues)]
        heapq.heapify(heads)
        while heads:
            clock.sleep_until(heads[0][0])
            run = []
            while heads and clock.ms_until(heads[0][0]) <= 0:
                _, index = heapq.heappop(heads)
                queue = queues[index]
                run.append(queue.popleft())
                if queue:
                    heapq.heappush(heads, (_due(queue[0]), index))
            if run:
                yield run


def _due(delivery: Delivery) -> int:
    assert delivery.due_ms is not None
    return delivery.due_ms
