"""Crash points for fault-injection tests: kill the job at a named step of a batch.

Off unless RETRYLIB_CRASH_AT names a point; then the process kills itself with SIGKILL
(no cleanup, as a machine failure would) when it reaches that point. RETRYLIB_CRASH_BATCH
optionally restricts the crash to one batch id.
"""

from __future__ import annotations

import os
import signal

CRASH_POINTS = (
    "after_handler",
    "after_manifest",
    "after_produce",
    "after_output_commit",
    "after_dead_letter_commit",
    "before_batch_end",
)

_crash_at = os.environ.get("RETRYLIB_CRASH_AT")
_crash_batch = os.environ.get("RETRYLIB_CRASH_BATCH")


def crash_point(name: str, batch_id: int) -> None:
    """SIGKILL this process if the environment asks for a crash at `name` (and `batch_id`)."""
    if _crash_at is None or _crash_at != name:
        return
    if _crash_batch is not None and int(_crash_batch) != batch_id:
        return
    os.kill(os.getpid(), signal.SIGKILL)
