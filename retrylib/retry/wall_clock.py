"""Waiting on this host's wall clock for a time in epoch milliseconds.

A routing task's retries read ahead, and a delay router's produce, wait for a due time that
was worked out on another clock (the driver's, a routing task's). Neither returns early by
its own clock, and a time already passed is not waited for.
"""

from __future__ import annotations

import time
from collections.abc import Callable


def sleep_until(
    due_ms: float,
    now_ms: float | None = None,
    sleep: Callable[[float], None] | None = None,
) -> None:
    """Sleep from `now_ms` (this host's wall clock when None) until `due_ms`; return at once
    when it has passed. `sleep` is `time.sleep` unless given."""
    if now_ms is None:
        now_ms = time.time() * 1000
    if due_ms > now_ms:
        (sleep or time.sleep)((due_ms - now_ms) / 1000)
