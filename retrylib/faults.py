"""Crash points for fault-injection tests: kill the job at a named step of a batch.

Off unless RETRYLIB_CRASH_AT names a point; a call then costs one comparison. When the
process reaches the named point it kills itself with SIGKILL (no cleanup, as a machine
failure would). Settings, all read once at import:

- RETRYLIB_CRASH_AT: the point, one of `CRASH_POINTS`; any other value raises `ValueError`
  at import, so a typo cannot make a fault test pass without ever crashing.
- RETRYLIB_CRASH_BATCH: crash only in this batch id.
- RETRYLIB_CRASH_SKIP: let this many hits of the point pass before crashing (default 0).

The kill takes the whole process group when this process leads it (the fault harness
starts the job in a session of its own), so the Spark JVM and the Python workers die at the
same instant as the driver; otherwise only this process is killed.

The points, in the order a batch reaches them (driver side, see `router` and
`kafka.transactional_producer`):

- after_handler: every task routed its records and wrote its files; no manifest yet.
- after_manifest: the batch's decisions are recorded; nothing produced or committed.
- in_produce: the staged records were sent inside the Kafka transaction, not committed.
- after_produce: the transaction (records + marker) is committed; no Delta commit yet.
- after_output_commit: the output table holds the batch; the dead-letter table not yet.
- after_dead_letter_commit: both tables hold the batch; staged files not yet removed.
- before_batch_end: the batch's effects are all done (the same state as the point
  before, reached one step later); staged files not yet removed.
- after_cleanup: staged files removed, `foreachBatch` about to return (Spark has not yet
  written the batch to its commit log).
"""

from __future__ import annotations

import os
import signal

CRASH_POINTS = (
    "after_handler",
    "after_manifest",
    "in_produce",
    "after_produce",
    "after_output_commit",
    "after_dead_letter_commit",
    "before_batch_end",
    "after_cleanup",
)


def _settings() -> tuple[str | None, int | None, int]:
    point = os.environ.get("RETRYLIB_CRASH_AT") or None
    if point is not None and point not in CRASH_POINTS:
        raise ValueError(f"RETRYLIB_CRASH_AT={point!r} is not a crash point; one of {CRASH_POINTS}")
    batch = os.environ.get("RETRYLIB_CRASH_BATCH")
    skip = os.environ.get("RETRYLIB_CRASH_SKIP")
    return point, int(batch) if batch else None, int(skip) if skip else 0


_crash_at, _crash_batch, _skip = _settings()


def crash_point(name: str, batch_id: int) -> None:
    """SIGKILL this process if the environment asks for a crash at `name` (and `batch_id`)."""
    global _skip
    if _crash_at != name:
        return
    if _crash_batch is not None and _crash_batch != batch_id:
        return
    if _skip > 0:
        _skip -= 1
        return
    message = f"retrylib fault injection: crash at {name} in batch {batch_id}\n"
    os.write(2, message.encode())  # stderr, unbuffered
    _kill_now()


def _kill_now() -> None:
    pid = os.getpid()
    if os.getpgid(0) == pid:  # leader of its own group: take the JVM and workers along
        os.killpg(pid, signal.SIGKILL)
    os.kill(pid, signal.SIGKILL)
