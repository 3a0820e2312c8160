"""How long a call of the user's code may run on an executor, and what ends it when it runs on.

Every call a routing task makes into user code (the handler, record or vectorised, and the
record hooks) has the limit `handler.timeout`, kept in three steps:

1. Once the call has run half its limit (30 s at most), one WARN names it and its record.
2. At the limit, one ERROR says so, and the call is interrupted: `HandlerTimeout` is raised
   in it (SIGALRM in the main thread here, an asynchronous exception on a lane,
   `task.lanes`), and again every `REFIRE_S` while it runs on. `HandlerTimeout` is a
   `BaseException`, so a handler's `except Exception` does not catch it; the record fails
   with it.
3. A call still running `GRACE_S` after its limit (it catches `BaseException`, blocks the
   signal, or waits in C code) has its Python worker ended by the process's watchdog
   (`task.watchdog`). The batch then runs again with each call in a process of its own
   (`call_isolated`), where the parent ends the call's process at the same bound: that
   record alone fails, as a `HandlerTimeout` saying its process was ended.

Each call past its limit is counted (`calls_timed_out`), each process ended for one too
(`call_processes_ended`, in the run with a process per call; a worker's own end is logged
by its watchdog and by the driver).
"""

from __future__ import annotations

import logging
import os
import pickle
import select
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable
from functools import partial
from typing import Any

from retrylib.handler import HandlerCrashed, HandlerTimeout
from retrylib.record import Record
from retrylib.retry.outcomes import Count
from retrylib.task.handler import Handler, as_failure
from retrylib.task.watchdog import GRACE_S, WATCHDOG

log = logging.getLogger(__name__)

REFIRE_S = 1.0
"""After a call's limit, how often it is interrupted again while it still has not returned
(a handler that catches the `HandlerTimeout` and carries on is interrupted again)."""
_IDLE_SECONDS = 2.0
"""How long the watcher thread waits for another call before it ends."""
_WARN_AFTER_MS = 30_000
"""How long a call runs before a WARN names it and its record (half the limit when less)."""


class TimedCall:
    """Calls a function with a wall-clock limit of `timeout_ms` (None or 0: none), counting
    the calls that run past it in `counters`.

    A daemon thread watches the call in progress: the WARN, the ERROR and the interrupts of
    the module docstring's steps 1 and 2 come from it (SIGALRM to the main thread, whose
    handler raises `HandlerTimeout` inside the call), and the call arms the process's
    watchdog for step 3. A call costs a few attribute and shared-memory writes; no timer is
    armed, so no signal reaches a call that returns in time (a signal would cut short a
    blocking call in C code that does not retry it).

    The limit applies only in a process's main thread (where Spark's Python workers run
    user code); elsewhere calls run unlimited and one warning is logged. Once the call has
    returned (or raised), a late signal is ignored, so a timeout never escapes into the
    caller's code.
    """

    def __init__(self, timeout_ms: int | None, counters: Counter[str] | None = None) -> None:
        self.timeout_ms = timeout_ms
        if timeout_ms and threading.current_thread() is not threading.main_thread():
            log.warning("handler timeout needs the main thread; calls run without a limit")
            self.timeout_ms = None
        self.counters: Counter[str] = Counter() if counters is None else counters
        self._calling = "handler"
        self._args: tuple[object, ...] = ()
        self._call = 0  # the number of the call in progress, or of the last one
        self._started: float | None = None  # when the call in progress started
        self._interrupted = -1  # the call the last SIGALRM was sent for
        self._watching = False  # a watcher thread runs (in this process)
        self._watcher_pid = 0
        self._watcher_lock = threading.Lock()
        self.limit_s = 0.0
        self._deadline = WATCHDOG.deadline  # this process's (`_start_watcher` asks again)
        if self.timeout_ms:
            self.limit_s = self.timeout_ms / 1000
            self._warn_s = min(_WARN_AFTER_MS, self.timeout_ms / 2) / 1000
            self._tick_s = max(0.01, min(1.0, self.limit_s / 20))
            self._main = threading.main_thread().ident
            signal.signal(signal.SIGALRM, self._on_alarm)

    def _on_alarm(self, signum: int, frame: object) -> None:
        if self._started is not None and self._interrupted == self._call:
            raise HandlerTimeout(f"{self._calling} did not return within {self.limit_s:g}s")

    def _watch(self) -> None:
        """The watcher thread: warn once per call, interrupt at the limit and every
        `REFIRE_S` after it while the call runs on; gone once no call has started for
        `_IDLE_SECONDS` (a task's calls are over)."""
        warned = interrupted_at = -1.0
        watched = -1
        idle: tuple[int, float] | None = None  # (the last call seen, when it was seen over)
        while True:
            time.sleep(self._tick_s)
            started, call = self._started, self._call
            if started is None:
                if idle is None or idle[0] != call:
                    idle = (call, time.monotonic())
                elif time.monotonic() - idle[1] >= _IDLE_SECONDS:
                    with self._watcher_lock:
                        if self._started is None and self._call == call:
                            self._watching = False
                            return
                continue
            idle = None
            if call != watched:
                watched, warned, interrupted_at = call, -1.0, -1.0
            ran = time.monotonic() - started
            if warned < 0 and ran >= self._warn_s:
                warned = ran
                log.warning(
                    "%s has run %.1fs on %s and goes on (handler.timeout %gs)",
                    self._calling,
                    ran,
                    describe(self._args),
                    self.limit_s,
                )
            if ran < self.limit_s:
                continue
            if interrupted_at < 0:
                log_past_limit(f"{self._calling} on {describe(self._args)}", self.limit_s)
            if interrupted_at < 0 or ran - interrupted_at >= REFIRE_S:
                interrupted_at = ran
                self._interrupted = call
                signal.pthread_kill(self._main, signal.SIGALRM)

    def _start_watcher(self) -> None:
        with self._watcher_lock:
            if self._watching and self._watcher_pid == os.getpid():
                return
            self._watching, self._watcher_pid = True, os.getpid()
            threading.Thread(target=self._watch, name="retrylib-timeout", daemon=True).start()
        WATCHDOG.start(self.limit_s)
        self._deadline = WATCHDOG.deadline  # in a forked call's child: one no watchdog reads

    def __call__(self, function: Handler, record: Record) -> Any:
        return self.call_named("handler", function, record)

    def call_named(self, calling: str, function: Callable[..., Any], *args: object) -> Any:
        """`function(*args)` under the limit; a `HandlerTimeout` says "`calling` did not
        return within ..."."""
        if not self.timeout_ms:
            return function(*args)
        self._calling, self._args = calling, args
        self._call += 1
        started = self._started = time.monotonic()  # before the look at the watcher: _watch
        if not self._watching or self._watcher_pid != os.getpid():  # a fork leaves it behind
            self._start_watcher()
        self._deadline.value = started + self.limit_s + GRACE_S  # `Watchdog.arm`, inlined
        try:
            return function(*args)
        finally:
            self._started = None
            self._deadline.value = 0.0
            if self._interrupted == self._call:
                self.counters[Count.CALLS_TIMED_OUT] += 1


def log_past_limit(call: str, limit_s: float) -> None:
    """The ERROR line of a `call` ("handler on topic[p]@o") that ran past its limit."""
    log.error(
        "%s has run past handler.timeout %gs: interrupted (HandlerTimeout, again every %gs "
        "while it runs); if it has not stopped %gs later, its Python worker is ended",
        call,
        limit_s,
        REFIRE_S,
        GRACE_S,
    )


def describe(args: tuple[object, ...]) -> str:
    """The record a call was given, as topic[partition]@offset, or what it was given."""
    first = args[0] if args else None
    if isinstance(first, Record):
        return f"{first.topic}[{first.partition}]@{first.offset}"
    return type(first).__name__


def call_isolated(timed: TimedCall, calling: str, function: Callable[..., Any], *args: Any) -> Any:
    """`timed.call_named(calling, function, *args)` in a forked child process, so that
    ending the process fails only this call: raises `HandlerCrashed` when the child dies
    without an answer, and `HandlerTimeout` when it has not answered `GRACE_S` after the
    limit (the child is then ended, logged at ERROR and counted).

    Slow (a fork per call): used only to re-run a batch whose Python worker died. The
    result and any failure travel back pickled; a failure that does not pickle comes back
    as a RuntimeError naming its class and message.
    """
    read_end, write_end = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - runs in the child
        os.close(read_end)
        WATCHDOG.stand_down()  # this process bounds the child: see the docstring
        try:
            outcome: tuple[str, Any] = ("result", timed.call_named(calling, function, *args))
        except BaseException as raised:
            outcome = ("error", as_failure(raised))
        try:
            data = pickle.dumps(outcome)
        except Exception:
            error = outcome[1]
            data = pickle.dumps(("error", RuntimeError(f"{type(error).__qualname__}: {error}")))
        with os.fdopen(write_end, "wb") as out:
            out.write(data)
        os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as answer:
        data = _answer(answer.fileno(), timed.limit_s + GRACE_S if timed.timeout_ms else None)
    if data is None:
        os.kill(child, signal.SIGKILL)
    _, status = os.waitpid(child, 0)
    if data is None:
        timed.counters.update([Count.CALLS_TIMED_OUT, Count.CALL_PROCESSES_ENDED])
        log.error(
            "%s on %s did not stop within %gs of handler.timeout %gs, interrupted: its process "
            "was ended; the record fails with HandlerTimeout",
            calling,
            describe(args),
            GRACE_S,
            timed.limit_s,
        )
        raise HandlerTimeout(
            f"{calling} did not return within {timed.limit_s:g}s, nor stop when interrupted: "
            f"its process was ended {GRACE_S:g}s later"
        )
    if not data:
        raise HandlerCrashed(f"{calling} killed its process ({_exit_description(status)})")
    kind, value = pickle.loads(data)
    if kind == "error":
        if isinstance(value, HandlerTimeout):
            timed.counters[Count.CALLS_TIMED_OUT] += 1
        raise value
    return value


def _answer(fd: int, bound_s: float | None) -> bytes | None:
    """All a child writes to `fd` until it closes it (empty when it died without a word);
    None when it has not closed it within `bound_s` seconds."""
    deadline = None if bound_s is None else time.monotonic() + bound_s
    chunks = []
    while True:
        if deadline is not None:
            ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                return None
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


def _exit_description(status: int) -> str:
    if os.WIFSIGNALED(status):
        return f"signal {signal.Signals(os.WTERMSIG(status)).name}"
    return f"exit code {os.WEXITSTATUS(status)}"


def bound_call(function: Handler, timed: TimedCall, *, isolate: bool = False) -> Callable:
    """The handler `function` as a one-argument callable under `timed`'s limit, each call in
    a process of its own when `isolate`.

    It is the function itself when there is neither, since a wrapper per call costs as much
    as a trivial handler. Calls may raise any BaseException: the caller passes what they
    raise through `as_failure`.
    """
    if isolate:
        return partial(call_isolated, timed, "handler", function)
    if timed.timeout_ms:
        return partial(timed, function)
    return function
