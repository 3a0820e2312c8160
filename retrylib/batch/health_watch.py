"""The driver's watch over `[breaker] health`: a user's function asked, every
`health_every`, whether the service the handler calls is up; the job pauses while it says
no (`Breaker.health`: the source then reads nothing, main topics and retry tiers alike).

Each call is bounded (`BoundedCall`): one that raises, or has not returned within
`health_timeout`, counts as down, with why; while a call runs on past its bound, no other
is started, and each look counts as down.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from retrylib.retry.breaker import Breaker
from retrylib.task.bounded_call import BoundedCall


class HealthWatch:
    """Asks `check` every `every_s` seconds (once started), and tells `breaker`."""

    def __init__(
        self, check: Callable[[], object], every_s: float, timeout_s: float, breaker: Breaker
    ) -> None:
        self._check = BoundedCall(check, timeout_s, "breaker.health_timeout", "breaker.health")
        self._every_s = every_s
        self._breaker = breaker
        self._stopped = threading.Event()

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
        up, failure = self._check()
        if failure is not None:
            return False, f"breaker.health {failure}"
        return bool(up), "breaker.health says " + ("up" if up else "down")

    def stop(self) -> None:
        """Stop asking (a call running now is left to end on its own)."""
        self._stopped.set()
