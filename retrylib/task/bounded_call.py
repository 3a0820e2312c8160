"""A user's function called on the driver with a bound (a batch hook, the breaker's health
check): in a thread of its own, waited for at most `timeout_s`.

A thread cannot be stopped, so a call still running at the bound is left to run in its
thread, and the function is not called again until that call has returned: a function that
hangs holds one thread, never its caller.
"""

from __future__ import annotations

import threading
from collections.abc import Callable


class BoundedCall:
    """`function`, called through `__call__` with the bound `timeout_s`, whose config key is
    `limit` (it names the bound in what a call that ran past it says)."""

    def __init__(
        self, function: Callable[..., object], timeout_s: float, limit: str, thread_name: str
    ) -> None:
        self._function = function
        self._timeout_s = timeout_s
        self._limit = limit
        self._thread_name = thread_name
        self._running: threading.Thread | None = None

    def __call__(self, *args: object) -> tuple[object, str | None]:
        """(what the function returned, None); or (None, why there is no answer): it raised,
        it has not returned within the bound, or an earlier call still runs (then it is not
        called this time)."""
        if self._running is not None and self._running.is_alive():
            return None, "is still running from an earlier call; not called this time"
        answers: list[tuple[object, str | None]] = []

        def run() -> None:
            try:
                answers.append((self._function(*args), None))
            except BaseException as error:  # the user's code: whatever it raises is an answer
                answers.append((None, f"raised {type(error).__name__}: {error}"))

        thread = threading.Thread(target=run, name=self._thread_name, daemon=True)
        thread.start()
        thread.join(self._timeout_s)
        if thread.is_alive():
            self._running = thread
            return None, (
                f"has not returned within {self._limit} ({self._timeout_s:g}s); it runs on in "
                "its thread, and is not called again until it returns"
            )
        return answers[0]
