"""The driver's watch over `[breaker] health`: a user's function asked, every
`health_every`, whether the service the handler calls is up; the job pauses while it says
no (`Breaker.health`: the source then reads nothing, main topics and retry tiers alike).

Each call is bounded: one that raises, or has not returned within `health_timeout`, counts
as down, with why. A call still running is not started again: the next look waits for it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from retrylib.breaker import Breaker


class HealthWatch:
    """Asks `check` every `every_s` seconds (once started), and tells `breaker`."""

    def __init__(
        self, check: Callable[[], object], every_s: float, timeout_s: float, breaker: Breaker
    ) -> None:
        self._check = check
        self._every_s = every_s
        self._timeout_s = timeout_s
        self._breaker = breaker
        self._stopped = threading.Event()
        self._call: threading.Thread | None = None
        self._answer: tuple[bool, str] | None = None

    def start(self) -> HealthWatch:
        """Ask once now (a job that starts while the service is down starts paused), then
        every `every_s` in a thread of its own; returns this watch."""
        self._tell()
        threading.Thread(target=self._watch, name="retrylib-health", daemon=True).start()
        return self

    def _watch(self) -> None:
        while not self._stopped.wait(self._every_s):
            self._tell()

    def _tell(self) -> None:
        up, why = self.ask()
        self._breaker.health(up, why)

    def ask(self) -> tuple[bool, str]:
        """One bounded call of the check: (up, why)."""
        if self._call is None or not self._call.is_alive():
            self._answer = None
            self._call = threading.Thread(target=self._run_check, daemon=True)
            self._call.start()
        self._call.join(self._timeout_s)
        if self._call.is_alive():
            return False, f"breaker.health has not returned within {self._timeout_s:g} s"
        assert self._answer is not None
        return self._answer

    def _run_check(self) -> None:
        try:
            up = bool(self._check())
        except Exception as error:  # the user's code: any failure counts as down
            self._answer = (False, f"breaker.health raised {type(error).__name__}: {error}")
            return
        self._answer = (up, "breaker.health says " + ("up" if up else "down"))

    def stop(self) -> None:
        """Stop asking (a call running now is left to end on its own)."""
        self._stopped.set()
