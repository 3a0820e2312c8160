"""Stopping the query: once the batch running now has finished and Spark recorded it, or
past a bound by cancelling it; and an availableNow run's stop at its target."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from pyspark.sql.streaming import StreamingQuery

from retrylib.batch.commit import BatchCommit
from retrylib.kafka.offsets import Offsets, progress_end_offsets, reached

log = logging.getLogger(__name__)

_STOP_WAIT_SECONDS = 120
# A cancelled batch ends when its tasks do: Spark kills a task's Python worker within seconds.
_CANCELLED_BATCH_WAIT_SECONDS = 30
_IDLE_MESSAGE = "Waiting for data to arrive"  # Spark's status after a trigger finds no data


def stop_at_target(query: StreamingQuery, batch_commit: BatchCommit, target: Offsets) -> None:
    """Stop `query` once a finished batch has read up to `target` in every partition, or a
    trigger found nothing to read (every source is at its target or has nothing new)."""
    while query.isActive:
        progress = query.lastProgress
        status = query.status
        idle = not status.get("isDataAvailable") and status.get("message") == _IDLE_MESSAGE
        if idle or (progress is not None and reached(progress_end_offsets(progress.json), target)):
            log.info("availableNow: everything up to the target is processed; stopping")
            stop_gracefully(query, batch_commit)
            return
        time.sleep(0.1)


def stop_gracefully(
    query: StreamingQuery,
    batch_commit: BatchCommit,
    timeout: float = _STOP_WAIT_SECONDS,
    cancel_batch: Callable[[], None] | None = None,
) -> bool:
    """Stop `query` once the batch running now (if any) has done its work and Spark has
    recorded it as done, within `timeout`; returns whether the stop cut into work the query
    had begun (a batch past the bound, or a trigger begun since the batch that Spark then
    reports as the query's error): that error is the stop's, and the work runs again at the
    next start.

    A batch Spark did not record as done (the bound passed) is replayed on restart, which
    reuses its manifest and commits nothing twice. Past the bound, `cancel_batch` (when
    given) cancels the batch's Spark jobs, and the stop waits for the batch to end with
    them: the query then ends failed by that cancellation. Without it, `query.stop()`
    interrupts Spark's stream thread inside the batch function, which a hung handler's
    batch answers with its traceback and a JVM stack overflow in the log. One line says
    where it stopped, and whether a batch was cut short.
    """
    batch_commit.batch_finished.clear()
    deadline = time.monotonic() + timeout
    finished = False
    while query.isActive and query.status.get("isTriggerActive"):
        finished = batch_commit.batch_finished.wait(0.05)
        if finished or time.monotonic() >= deadline:
            break
    if finished:
        # Past the batch commit's end of the batch Spark writes its commit log; a stop then
        # interrupts that write and leaves the batch to be replayed.
        while not _recorded_done(query, batch_commit.last_finished) and time.monotonic() < deadline:
            time.sleep(0.02)
    cut_short = bool(not finished and query.isActive and query.status.get("isTriggerActive"))
    if cut_short and cancel_batch is not None:
        cancel_batch()
        ends = time.monotonic() + _CANCELLED_BATCH_WAIT_SECONDS
        while query.isActive and time.monotonic() < ends:
            time.sleep(0.05)
    # Past the batch, Spark may have begun the next trigger, which the stop interrupts. Spark
    # takes only some errors for its own interruption (InterruptedException and kin); what a
    # storage client or a Python source makes of one can end the query failed by it.
    # Nothing of that trigger is committed.
    running = query.isActive
    query.stop()
    interrupted = running and not cut_short and query.exception() is not None
    if interrupted:
        log.debug("the stop interrupted the trigger begun: %s", query.exception())
    done = (
        "no batch" if batch_commit.last_finished is None else f"batch {batch_commit.last_finished}"
    )
    if cut_short:
        log.warning(
            "stopped after %s; the batch running did not finish within %gs and runs again "
            "at the next start, committing nothing twice",
            done,
            timeout,
        )
    else:
        log.info("stopped after %s; the next start goes on from there", done)
    return cut_short or interrupted


def _recorded_done(query: StreamingQuery, batch_id: int) -> bool:
    """Whether Spark has recorded batch `batch_id` as done (its progress is reported after
    its commit log is written), or `query` is no longer running."""
    if not query.isActive:
        return True
    progress = query.lastProgress
    return progress is not None and progress.batchId >= batch_id
