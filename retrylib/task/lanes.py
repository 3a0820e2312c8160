"""Virtual partitions (zkafka's): one task's handler calls spread over `handler.parallelism`
lanes, threads that each handle their records one after another.

Spark runs one task per core, so a handler that mostly waits (an HTTP call, a database
write) leaves the core idle. With lanes a task waits on that many calls at once. A record's
lane is a hash of its key (CRC-32, the same in every process), so the records of one key
are handled one at a time, in the order they were read; records without a key are spread
by offset. The outcomes are kept in the records' order, so what the task returns does not
depend on which call finished first.

The handler's timeout (`handler.timeout`) is kept by the task's own thread, since SIGALRM
cannot stop a call outside the main thread: a call over it counts as a `HandlerTimeout`
and its lane goes on with its next record. The late call is not stopped: its thread
finishes it and what it returns is ignored. Spare threads take new calls while late ones
run; once they are all taken, further calls wait for a thread.
"""

from __future__ import annotations

import time
import zlib
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any

from retrylib.handler import HandlerTimeout
from retrylib.record import Record
from retrylib.task.handler import as_failure

SPARE_THREADS = 16
"""Threads beyond the lanes, for calls that went on past their timeout."""


@dataclass
class Call:
    """One handler call: what it returned, or the failure it ends in, and how long it took."""

    result: Any = None
    error: Exception | None = None
    elapsed_ns: int = 0


def lane_of(key: bytes | None, offset: int, lanes: int) -> int:
    """The lane of a record with `key` at `offset`: by key, or by offset when it has none."""
    if key is None:
        return offset % lanes
    return zlib.crc32(key) % lanes


class Lanes:
    """Handler calls of one task on `count` lanes; see the module docstring.

    `call` is one record's call, hooks included; it may raise anything. `timeout_ms` None
    means no limit; `on_late` is told of each record whose call went over it.
    """

    def __init__(
        self,
        count: int,
        call: Callable[[Record], Any],
        timeout_ms: int | None,
        on_late: Callable[[Record], None] | None = None,
    ) -> None:
        self.count = count
        self._call = call
        self._on_late = on_late
        self._timeout_ns = None if not timeout_ms else timeout_ms * 1_000_000
        self._pool = ThreadPoolExecutor(count + SPARE_THREADS, thread_name_prefix="retrylib-lane")

    def call_all(self, records: Sequence[Record]) -> list[Call]:
        """Call the handler for every record, each lane in order; the calls in `records`'
        order."""
        queues: dict[int, deque[int]] = {}
        for index, record in enumerate(records):
            queues.setdefault(lane_of(record.key, record.offset, self.count), deque()).append(index)
        calls = [Call() for _ in records]
        running: dict[Future[Call], tuple[int, int, int]] = {}  # -> (lane, index, started)

        def start(lane: int) -> None:
            queue = queues[lane]
            if queue:
                index = queue.popleft()
                future = self._pool.submit(self._timed, records[index])
                running[future] = (lane, index, time.perf_counter_ns())

        for lane in queues:
            start(lane)
        while running:
            done, _ = wait(running, timeout=self._wait_s(running), return_when=FIRST_COMPLETED)
            for future in done:
                lane, index, _ = running.pop(future)
                calls[index] = future.result()
                start(lane)
            if self._timeout_ns is None:
                continue
            now = time.perf_counter_ns()
            for future, (lane, index, started) in list(running.items()):
                if now - started >= self._timeout_ns:
                    del running[future]
                    limit = self._timeout_ns / 1e9
                    late = HandlerTimeout(f"handler did not return within {limit:g}s")
                    calls[index] = Call(error=late, elapsed_ns=now - started)
                    if self._on_late is not None:
                        self._on_late(records[index])
                    start(lane)
        return calls

    def _wait_s(self, running: dict[Future[Call], tuple[int, int, int]]) -> float | None:
        """How long to wait for a call to finish before checking for calls over the limit."""
        if self._timeout_ns is None:
            return None
        first = min(started for _, _, started in running.values())
        return max(0.0, (first + self._timeout_ns - time.perf_counter_ns()) / 1e9)

    def _timed(self, record: Record) -> Call:
        started = time.perf_counter_ns()
        try:
            result = self._call(record)
        except BaseException as raised:  # the record fails with it; the lane goes on
            return Call(error=as_failure(raised), elapsed_ns=time.perf_counter_ns() - started)
        return Call(result=result, elapsed_ns=time.perf_counter_ns() - started)

    def close(self) -> None:
        """Let the threads go once their calls are done (late ones included)."""
        self._pool.shutdown(wait=False)
