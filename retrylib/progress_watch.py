"""What a Spark Connect client learns of its job's batches, which the server runs.

In a classic session the job's `BatchRouter` runs each batch in this process and says
itself which batch finished, and which retrylib error failed one. A Spark Connect server
runs the batches in a copy of the router of its own (`router.BatchFunction`); the client's
router learns from the query's progress which batch finished (Spark reports it after the
batch's commit log is written). The error that failed a batch is named in the text of the
query's exception (the server's Python traceback: `router.task_error`).
"""

from __future__ import annotations

import logging
import threading
import time

from pyspark.sql.streaming import StreamingQuery
from pyspark.sql.streaming.listener import StreamingQueryProgress

from retrylib.router import BatchRouter

log = logging.getLogger(__name__)

_POLL_SECONDS = 0.1


def follow_progress(query: StreamingQuery, router: BatchRouter) -> None:
    """Keep `router.last_finished` and `batch_finished` up to date from `query`'s progress,
    in a thread, while the query runs."""
    threading.Thread(
        target=_follow,
        args=(query, router),
        name=f"retrylib-progress-{query.name}",
        daemon=True,
    ).start()


def _follow(query: StreamingQuery, router: BatchRouter) -> None:
    while True:
        try:
            active = query.isActive
            finished = finished_batch(query.lastProgress)
        except Exception as error:  # the server went away: the job's main loop reports it
            log.debug("reading the query's progress failed: %s", error)
            return
        if finished is not None and finished != router.last_finished:
            log.info("batch %d done on the Spark Connect server", finished)
            router.last_finished = finished
            router.batch_finished.set()
        if not active:
            return
        time.sleep(_POLL_SECONDS)


def finished_batch(progress: StreamingQueryProgress | None) -> int | None:
    """The batch a progress report is of, or None when its trigger ran no batch (Spark also
    reports triggers that found no data)."""
    if progress is None or "addBatch" not in (progress.durationMs or {}):
        return None
    return progress.batchId
