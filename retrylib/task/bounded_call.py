"""A user's function called on the driver with a bound (a batch hook, the breaker's health
check): in a thread of its own, waited for at most `timeout_s`.

At the bound the call is interrupted: `HandlerTimeout` is raised in its thread
(`thread_interrupt`), and again each time the function is due while the call runs on. A
thread cannot be ended, though, and the driver is not ended for a hook: a call that does
not stop is left to run, and the function is not called again until that call has
returned. So a function that hangs holds one thread, never its caller, the batches or the
job's stop (the thread is a daemon).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from retrylib.task.thread_interrupt import interrupt_thread

log = logging.getLogger(__name__)


class BoundedCall:
    """`function`, called through `__call__` with the bound `timeout_s`, whose config key is
    `limit`; `calling` names the function in the log (and its thread)."""

    def __init__(
        self, function: Callable[..., object], timeout_s: float, limit: str, calling: str
    ) -> None:
        self._function = function
        self._timeout_s = timeout_s
        self._limit = limit
        self._calling = calling
        self._running: threading.Thread | None = None

    def __call__(self, *args: object) -> tuple[object, str | None]:
        """(what the function returned, None); or (None, why there is no answer): it raised,
        it has not returned within the bound, or an earlier call still runs (then it is not
        called this time)."""
        if self._running is not None and self._running.is_alive():
            interrupt_thread(self._running.ident or 0)
            return None, "is still running from an earlier call; not called this time"
        answers: list[tuple[object, str | None]] = []

        def run() -> None:
            try:
                answers.append((self._function(*args), None))
            except BaseException as error:  # the user's code: whatever it raises is an answer
                answers.append((None, f"raised {type(error).__name__}: {error}"))

        thread = threading.Thread(target=run, name=f"retrylib {self._calling}", daemon=True)
        thread.start()
        thread.join(self._timeout_s)
        if thread.is_alive():
            self._running = thread
            interrupt_thread(thread.ident or 0)
            log.error(
                "%s has not returned within %s (%gs): interrupted (HandlerTimeout); the job "
                "goes on without it, and it is not called again until this call returns",
                self._calling,
                self._limit,
                self._timeout_s,
            )
            return None, (
                f"has not returned within {self._limit} ({self._timeout_s:g}s); it was "
                "interrupted, and is not called again until it returns"
            )
        return answers[0]
