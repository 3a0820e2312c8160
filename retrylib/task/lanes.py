"""Virtual partitions (zkafka's): one task's handler calls spread over `handler.parallelism`
lanes, threads that each handle their records one after another.

Spark runs one task per core, so a handler that mostly waits (an HTTP call, a database
write) leaves the core idle. With lanes a task waits on that many calls at once. A record's
lane is a hash of its key (CRC-32, the same in every process), so the records of one key
are handled one at a time, in the order they were read; records without a key are spread
by offset. The outcomes are kept in the records' order, so what the task returns does not
depend on which call finished first.

The handler's timeout (`handler.timeout`) is kept by the task's own thread, in the steps
of `task.call_bounds`: a call over it counts as a `HandlerTimeout` at once and its lane
goes on with its next record, while the late call's thread is interrupted (the
`HandlerTimeout` raised in it, `thread_interrupt`) every `REFIRE_S` until the call ends;
what it returns is ignored. Spare threads take new calls while late ones run; once they are
all taken, further calls wait for a thread. The task's calls end only once its late calls
have too, or their grace has passed: then the process's watchdog (`task.watchdog`) ends
the worker, since a thread that does not stop cannot be stopped from inside.
"""

from __future__ import annotations

import threading
import time
import zlib
from collections import Counter, deque
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any

from retrylib.handler import HandlerTimeout
from retrylib.record import Record
from retrylib.retry.outcomes import Count
from retrylib.task.call_bounds import REFIRE_S, describe, log_past_limit
from retrylib.task.handler import Failure, as_failure
from retrylib.task.thread_interrupt import interrupt_thread, landing
from retrylib.task.watchdog import GRACE_S, WATCHDOG, Watchdog

SPARE_THREADS = 16
"""Threads beyond the lanes, for calls that went on past their timeout."""


@dataclass
class Call:
    """One handler call: what it returned, or the failure it ends in, and how long it took."""

    result: Any = None
    error: Failure | None = None
    elapsed_ns: int = 0


@dataclass
class _Running:
    """A call on a lane: when it was given to a thread, and, once a thread runs it, which
    (`thread`) and since when (`started`, `time.monotonic()`); `ended` once it has."""

    submitted: float
    thread: int = 0
    started: float = 0.0
    ended: bool = False
    interrupted_at: float = 0.0  # when it was last interrupted (0: never)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def interrupt(self, now: float) -> None:
        """Raise `HandlerTimeout` in the call's thread, if it runs the call now."""
        with self.lock:  # never once the call has ended: see `Lanes._timed`
            if self.thread and not self.ended:
                interrupt_thread(self.thread)
                self.interrupted_at = now


def lane_of(key: bytes | None, offset: int, lanes: int) -> int:
    """The lane of a record with `key` at `offset`: by key, or by offset when it has none."""
    if key is None:
        return offset % lanes
    return zlib.crc32(key) % lanes


class Lanes:
    """Handler calls of one task on `count` lanes; see the module docstring.

    `call` is one record's call, hooks included; it may raise anything. `timeout_ms` None
    means no limit; the calls past it are counted in `counters`, and `on_late` is told of
    each record whose call went over it. `watchdog` ends the process when a late call does
    not stop (None: nothing does, and the calls end without waiting for it).
    """

    def __init__(
        self,
        count: int,
        call: Callable[[Record], Any],
        timeout_ms: int | None,
        counters: Counter[str] | None = None,
        on_late: Callable[[Record], None] | None = None,
        watchdog: Watchdog | None = WATCHDOG,
    ) -> None:
        self.count = count
        self._call = call
        self._on_late = on_late
        self._counters: Counter[str] = Counter() if counters is None else counters
        self._limit_s = None if not timeout_ms else timeout_ms / 1000
        self._watchdog = watchdog if self._limit_s is not None else None
        if self._watchdog is not None:
            self._watchdog.start(self._limit_s)
        self._pool = ThreadPoolExecutor(count + SPARE_THREADS, thread_name_prefix="retrylib-lane")

    def call_all(self, records: Sequence[Record]) -> list[Call]:
        """Call the handler for every record, each lane in order; the calls in `records`'
        order. Returns once every call has ended, or is late and past its grace (and then,
        with a watchdog, not before it has had the time to end the process)."""
        queues: dict[int, deque[int]] = {}
        for index, record in enumerate(records):
            queues.setdefault(lane_of(record.key, record.offset, self.count), deque()).append(index)
        calls = [Call() for _ in records]
        running: dict[Future[Call], tuple[int, int, _Running]] = {}  # -> (lane, index, call)
        late: list[tuple[int, _Running]] = []  # calls past their limit: (index, call)

        def start(lane: int) -> None:
            queue = queues[lane]
            if queue:
                index = queue.popleft()
                call = _Running(time.monotonic())
                running[self._pool.submit(self._timed, records[index], call)] = (lane, index, call)

        for lane in queues:
            start(lane)
        while running or late:
            if running:
                done, _ = wait(running, self._wait_s(running, late), FIRST_COMPLETED)
            else:
                done = set()
                time.sleep(self._wait_s(running, late) or 0.0)
            for future in done:
                lane, index, _ = running.pop(future)
                calls[index] = future.result()
                start(lane)
            if self._limit_s is None:
                continue
            now = time.monotonic()
            for future, (lane, index, call) in list(running.items()):
                if now - call.submitted >= self._limit_s:
                    del running[future]
                    calls[index] = self._went_late(records[index], future, call, now)
                    late.append((index, call))
                    start(lane)
            late = [(index, call) for index, call in late if not call.ended]
            for _, call in late:
                if now - call.interrupted_at >= REFIRE_S:
                    call.interrupt(now)
            self._arm([call for _, _, call in running.values()] + [call for _, call in late])
            if not running and all(now >= c.submitted + self._limit_s + GRACE_S for _, c in late):
                break
        if late and self._watchdog is not None:
            # A call that would not stop: the watchdog ends this process within its tick.
            # The task waits for that rather than end with the call's thread still running.
            time.sleep(GRACE_S)
        return calls

    def _went_late(self, record: Record, future: Future[Call], call: _Running, now: float) -> Call:
        """The outcome of `record`, whose `call` has not ended within the limit: it fails,
        and its thread is interrupted (a call no thread has begun is not begun at all)."""
        self._counters[Count.CALLS_TIMED_OUT] += 1
        if self._on_late is not None:
            self._on_late(record)
        if future.cancel():
            call.ended = True
        else:
            log_past_limit(f"handler on {describe((record,))} (on a lane)", self._limit_s)
            call.interrupt(now)
        error = HandlerTimeout(f"handler did not return within {self._limit_s:g}s")
        return Call(error=error, elapsed_ns=int((now - call.submitted) * 1e9))

    def _arm(self, calls: list[_Running]) -> None:
        """Arm the watchdog for the earliest of `calls` a thread runs (disarm when none)."""
        if self._watchdog is None:
            return
        begun = [call.started for call in calls if call.started and not call.ended]
        if begun:
            self._watchdog.arm(min(begun))
        else:
            self._watchdog.disarm()

    def _wait_s(
        self,
        running: dict[Future[Call], tuple[int, int, _Running]],
        late: list[tuple[int, _Running]],
    ) -> float | None:
        """How long to wait for a call to end before looking at the calls over the limit
        again: until the next call reaches its limit, or a late one its next interrupt."""
        if self._limit_s is None:
            return None
        limit = self._limit_s
        due = [call.submitted + limit for _, _, call in running.values()]
        due += [min(c.interrupted_at + REFIRE_S, c.submitted + limit + GRACE_S) for _, c in late]
        return max(0.0, min(due) - time.monotonic())

    def _timed(self, record: Record, call: _Running) -> Call:
        """A lane thread's part: `record`'s call, noted in `call` as it starts and ends."""
        with call.lock:
            call.thread, call.started = threading.get_ident(), time.monotonic()
        if self._watchdog is not None:  # here: a call that holds the GIL keeps `call_all` out
            self._watchdog.arm_unless_earlier(call.started)
        started = time.perf_counter_ns()
        try:
            try:
                result = self._call(record)
            except BaseException as raised:  # the record fails with it; the lane goes on
                return Call(error=as_failure(raised), elapsed_ns=time.perf_counter_ns() - started)
            finally:
                with call.lock:
                    call.ended = True
                landing()  # an interrupt sent before `ended` was set lands here, in the try
            return Call(result=result, elapsed_ns=time.perf_counter_ns() - started)
        except HandlerTimeout as interrupted:  # the call was late: its outcome is not used
            return Call(error=interrupted)

    def close(self) -> None:
        """Let the threads go once their calls are done (late ones included)."""
        self._pool.shutdown(wait=False)
