"""Calling the user's handler on one record, and checking what it returned.

Everything a handler can do wrong becomes an exception here, so the caller routes the
record to retry or the dead letter instead of crashing the task: raising anything (also
`SystemExit` or `KeyboardInterrupt` raised inside the handler), hanging past the timeout,
or returning rows that do not fit the output schema.
"""

from __future__ import annotations

import logging
import os
import pickle
import signal
import threading
import time
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

from retrylib.config.importing import import_object
from retrylib.handler import (
    BadHandlerResult,
    HandlerCrashed,
    HandlerRaisedBaseException,
    HandlerTimeout,
)
from retrylib.record import Record

log = logging.getLogger(__name__)

Handler = Callable[[Record], Any]

_loaded: dict[tuple[str, tuple[str, ...]], Handler] = {}


def load_handler(spec: str, paths: Sequence[str] = ()) -> Handler:
    """Import the handler `spec` ("module:function") once per process; raises on failure."""
    cache_key = (spec, tuple(paths))
    if cache_key not in _loaded:
        handler = import_object(spec, paths)
        if not callable(handler):
            raise TypeError(f"handler {spec!r} is not callable")
        _loaded[cache_key] = handler
    return _loaded[cache_key]


_REFIRE_SECONDS = 1.0
"""After a timeout, how often the call is interrupted again while it still has not returned
(a handler that catches the `HandlerTimeout` and carries on is interrupted again)."""
_IDLE_SECONDS = 2.0
"""How long the watcher thread waits for another call before it ends."""
_WARN_AFTER_MS = 30_000
"""How long a call runs before a WARN names it and its record (half the limit when less)."""


class TimedCall:
    """Calls a function with a wall-clock limit of `timeout_ms` (None or 0: none).

    A daemon thread watches the call in progress: once it has run half its limit (30 s at
    most) one WARN names the call and its record, and at the limit the thread sends SIGALRM
    to the main thread, whose handler raises `HandlerTimeout` inside the call. A call costs
    two attribute writes; no timer is armed, so no signal reaches a call that returns in
    time (a signal would cut short a blocking call in C code that does not retry it).

    The limit applies only in a process's main thread (where Spark's Python workers run
    user code); elsewhere calls run unlimited and one warning is logged. A call blocked
    inside C code that ignores signals is interrupted when it returns to Python; a handler
    that swallows every exception (`except BaseException`) in a loop cannot be stopped.
    Once the call has returned (or raised), a late signal is ignored, so a timeout never
    escapes into the caller's code.
    """

    def __init__(self, timeout_ms: int | None) -> None:
        self.timeout_ms = timeout_ms
        if timeout_ms and threading.current_thread() is not threading.main_thread():
            log.warning("handler timeout needs the main thread; calls run without a limit")
            self.timeout_ms = None
        self._calling = "handler"
        self._args: tuple[object, ...] = ()
        self._call = 0  # the number of the call in progress, or of the last one
        self._started: float | None = None  # when the call in progress started
        self._interrupted = -1  # the call the last SIGALRM was sent for
        self._watching = False  # a watcher thread runs (in this process)
        self._watcher_pid = 0
        self._watcher_lock = threading.Lock()
        if self.timeout_ms:
            self._limit_s = self.timeout_ms / 1000
            self._warn_s = min(_WARN_AFTER_MS, self.timeout_ms / 2) / 1000
            self._tick_s = max(0.01, min(1.0, self._limit_s / 20))
            self._main = threading.main_thread().ident
            signal.signal(signal.SIGALRM, self._on_alarm)

    def _on_alarm(self, signum: int, frame: object) -> None:
        if self._started is not None and self._interrupted == self._call:
            raise HandlerTimeout(f"{self._calling} did not return within {self._limit_s:g}s")

    def _watch(self) -> None:
        """The watcher thread: warn once per call, interrupt at the limit and every
        `_REFIRE_SECONDS` after it while the call runs on; gone once no call has started
        for `_IDLE_SECONDS` (a task's calls are over)."""
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
                    _describe(self._args),
                    self._limit_s,
                )
            if ran >= self._limit_s and (
                interrupted_at < 0 or ran - interrupted_at >= _REFIRE_SECONDS
            ):
                interrupted_at = ran
                self._interrupted = call
                signal.pthread_kill(self._main, signal.SIGALRM)

    def _start_watcher(self) -> None:
        with self._watcher_lock:
            if self._watching and self._watcher_pid == os.getpid():
                return
            self._watching, self._watcher_pid = True, os.getpid()
            threading.Thread(target=self._watch, name="retrylib-timeout", daemon=True).start()

    def __call__(self, function: Handler, record: Record) -> Any:
        return self.call_named("handler", function, record)

    def call_named(self, calling: str, function: Callable[..., Any], *args: object) -> Any:
        """`function(*args)` under the limit; a `HandlerTimeout` says "`calling` did not
        return within ..."."""
        if not self.timeout_ms:
            return function(*args)
        self._calling, self._args = calling, args
        self._call += 1
        self._started = time.monotonic()  # before the look at the watcher: see _watch
        if not self._watching or self._watcher_pid != os.getpid():  # a fork leaves it behind
            self._start_watcher()
        try:
            return function(*args)
        finally:
            self._started = None


def _describe(args: tuple[object, ...]) -> str:
    """The record a call was given, as topic[partition]@offset, or what it was given."""
    first = args[0] if args else None
    if isinstance(first, Record):
        return f"{first.topic}[{first.partition}]@{first.offset}"
    return type(first).__name__


def call_isolated(timed: TimedCall, function: Handler, record: Any) -> Any:
    """Call the handler in a forked child process, so that killing the process fails only
    this call: raises `HandlerCrashed` when the child dies without an answer.

    Slow (a fork per call): used only to re-run a batch whose Python worker died. The
    result and any exception travel back pickled; an exception that does not pickle comes
    back as a RuntimeError naming its class and message.
    """
    read_end, write_end = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - runs in the child
        os.close(read_end)
        try:
            outcome: tuple[str, Any] = ("result", call_handler(timed, function, record))
        except Exception as e:
            outcome = ("error", e)
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
        data = answer.read()
    _, status = os.waitpid(child, 0)
    if not data:
        raise HandlerCrashed(f"handler killed its process ({_exit_description(status)})")
    kind, value = pickle.loads(data)
    if kind == "error":
        raise value
    return value


def _exit_description(status: int) -> str:
    if os.WIFSIGNALED(status):
        return f"signal {signal.Signals(os.WTERMSIG(status)).name}"
    return f"exit code {os.WEXITSTATUS(status)}"


def call_handler(timed: TimedCall, function: Handler, record: Record) -> Any:
    """Call the handler; a BaseException that is not an Exception is re-raised as one."""
    try:
        return timed(function, record)
    except Exception:
        raise
    except BaseException as e:  # the handler's own SystemExit/KeyboardInterrupt: a failure
        raise as_failure(e) from e


def bound_call(function: Handler, timed: TimedCall, *, isolate: bool = False) -> Callable:
    """`function` as a one-argument callable with the timeout and isolation applied.

    It is the function itself when there is neither, since a wrapper per call costs as much
    as a trivial handler. Calls may raise any BaseException: the caller passes what they
    raise through `as_failure`.
    """
    if isolate:
        return partial(call_isolated, timed, function)
    if timed.timeout_ms:
        return partial(timed, function)
    return function


def as_failure(raised: BaseException) -> Exception:
    """What a handler raised, as the exception its record fails with: an Exception as it
    is, any other BaseException (SystemExit, KeyboardInterrupt, ...) as a
    `HandlerRaisedBaseException` naming it."""
    if isinstance(raised, Exception):
        return raised
    detail = _text(raised)
    failure = HandlerRaisedBaseException(
        f"handler raised {type(raised).__name__}" + (f": {detail}" if detail else "")
    )
    failure.__cause__ = raised
    return failure


def _text(error: BaseException) -> str:
    try:
        return str(error)
    except Exception:
        return "<unprintable>"


def result_rows(result: Any, columns: frozenset[str]) -> list[dict[str, Any]]:
    """The output rows of one handler call: None -> [], dict -> [dict], list of dicts as is.

    Raises `BadHandlerResult` naming the problem when the result has another type or a row
    has a key that is not an output column (a missing key becomes a null).
    """
    if result is None:
        return []
    rows = [result] if isinstance(result, dict) else result
    if not isinstance(rows, list):
        raise BadHandlerResult(
            f"handler returned {type(result).__name__}; return a dict, a list of dicts or None"
        )
    for row in rows:
        if not isinstance(row, dict):
            raise BadHandlerResult(f"handler returned a list holding {type(row).__name__}")
        unknown = row.keys() - columns
        if unknown:
            raise BadHandlerResult(
                f"handler returned column(s) {sorted(unknown)} not in the output schema "
                f"{sorted(columns)}"
            )
    return rows
