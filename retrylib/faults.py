"""Crash points for fault-injection tests: kill the job at a named step of a batch.

Off unless RETRYLIB_CRASH_AT names a point; a call then costs one comparison. When a process
reaches the named point it kills itself with SIGKILL (no cleanup, as a machine failure
would). Settings, all read once at import:

- RETRYLIB_CRASH_AT: the point, one of `CRASH_POINTS`; any other value raises `ValueError`
  at import, so a typo cannot make a fault test pass without ever crashing.
- RETRYLIB_CRASH_BATCH: crash only in this batch id.
- RETRYLIB_CRASH_SKIP: let this many hits of the point pass before crashing (default 0).
- RETRYLIB_CRASH_ONCE: a file path; only the process that creates it crashes, once, so a
  point in an executor that Spark retries is passed the second time.

What dies: when the driver leads its own process group (the fault harness starts the job
in a session of its own), a crash takes the whole group, driver, Spark's JVM and the Python
workers at the same instant; the driver hands the group to the workers in
RETRYLIB_CRASH_GROUP (Spark's Python daemon puts them in a group of their own). Otherwise
only the process at the point dies: on an executor that is a lost Python worker, whose task
Spark runs again.

The points, in the order a batch reaches them (see `router` and
`kafka.transactional_producer`):

- after_handler: every task routed its records and wrote its files; no manifest yet.
- after_manifest: the batch's decisions are recorded; nothing produced or committed.
- in_produce (executor): a produce unit's records and marker were sent inside its Kafka
  transaction, not committed.
- after_unit_commit (executor): a produce unit's transaction is committed; its task has not
  returned.
- after_produce: every unit's transaction is committed; no Delta commit yet.
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
    "after_unit_commit",
    "after_produce",
    "after_output_commit",
    "after_dead_letter_commit",
    "before_batch_end",
    "after_cleanup",
)
_GROUP = "RETRYLIB_CRASH_GROUP"


def _settings() -> tuple[str | None, int | None, int, str | None]:
    point = os.environ.get("RETRYLIB_CRASH_AT") or None
    if point is not None and point not in CRASH_POINTS:
        raise ValueError(f"RETRYLIB_CRASH_AT={point!r} is not a crash point; one of {CRASH_POINTS}")
    batch = os.environ.get("RETRYLIB_CRASH_BATCH")
    skip = os.environ.get("RETRYLIB_CRASH_SKIP")
    if point is not None and _GROUP not in os.environ and os.getpgid(0) == os.getpid():
        os.environ[_GROUP] = str(os.getpid())  # inherited by the JVM and its workers
    once = os.environ.get("RETRYLIB_CRASH_ONCE") or None
    return point, int(batch) if batch else None, int(skip) if skip else 0, once


_crash_at, _crash_batch, _skip, _once = _settings()


def crash_point(name: str, batch_id: int) -> None:
    """SIGKILL this process (or its job, see the module docstring) if the environment asks
    for a crash at `name` (and `batch_id`)."""
    global _skip
    if _crash_at != name:
        return
    if _crash_batch is not None and _crash_batch != batch_id:
        return
    if _skip > 0:
        _skip -= 1
        return
    if _once is not None:
        try:
            os.close(os.open(_once, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            return
    message = f"retrylib fault injection: crash at {name} in batch {batch_id}\n".encode()
    os.write(2, message)  # stderr, unbuffered
    _kill_now(message)


def _kill_now(message: bytes) -> None:
    group = os.environ.get(_GROUP)
    if group is not None and _once is None:  # the whole job: driver, JVM and workers
        if int(group) != os.getpid():
            # A worker's stderr reaches the log through a thread of the JVM, which dies with
            # the group before it copies the line: write it to the driver's stderr too.
            try:
                with open(f"/proc/{group}/fd/2", "wb", buffering=0) as driver_stderr:
                    driver_stderr.write(message)
            except OSError:
                pass
        os.killpg(int(group), signal.SIGKILL)
    os.kill(os.getpid(), signal.SIGKILL)
