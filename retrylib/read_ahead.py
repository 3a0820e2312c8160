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

if TYPE_CHECKING:
    from retrylib.retry_records import Delivery


class WaitingRetries:
    """The retries of one task that wait to be due, a queue per key in the order read."""

    def __init__(self) -> None:
        self._queues: dict[bytes | None, deque[Delivery]] = {}

    def must_wait(self, delivery: Delivery, ms_until: Callable[[int], float]) -> bool:
        """Whether `delivery` waits here: it is not due yet (`ms_until` its due time is
        above zero), or an earlier record of its key waits. Adds it when so."""
        key = delivery.record.key
        assert delivery.due_ms is not None
        if key not in self._queues and ms_until(delivery.due_ms) <= 0:
            return False
        self._queues.setdefault(key, deque()).append(delivery)
        return True

    def runs(
        self, ms_until: Callable[[int], float], sleep: Callable[[float], None] = time.sleep
    ) -> Iterator[list[Delivery]]:
        """Every waiting retry, in runs of those due at once, each run after sleeping until
        its first is due; earliest due first, a key's in the order read. Empties the queues."""
        queues = list(self._queues.values())
        self._queues = {}
        heads = [(_due(queue[0]), index) for index, queue in enumerate(queues)]
        heapq.heapify(heads)
        while heads:
            wait_ms = ms_until(heads[0][0])
            if wait_ms > 0:
                sleep(wait_ms / 1000)
            run = []
            while heads and ms_until(heads[0][0]) <= 0:
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
