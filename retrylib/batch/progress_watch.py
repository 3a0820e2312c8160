"""What a Spark Connect client learns of its job's batches, which the server runs.

In a classic session the job's `BatchCommit` runs each batch in this process and says
itself which batch finished, and which retrylib error failed one. A Spark Connect server
runs the batches in a copy of the batch commit of its own (`commit.BatchFunction`); the client's
batch commit learns from the query's progress which batch finished (Spark reports it after the
batch's commit log is written). The error that failed a batch is named in the text of the
query's exception (the server's Python traceback: `spark_errors.task_error`).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from pyspark.sql.streaming import StreamingQuery
from pyspark.sql.streaming.listener import StreamingQueryProgress

log = logging.getLogger(__name__)

_POLL_SECONDS = 0.1
_STOP_WAIT_SECONDS = 10


class ProgressWatch:
    """Calls `on_batch(batch_id)` for each batch `query` finishes, in order, from a thread
    that reads the query's progress while it runs; `stop()` catches up with the batches
    reported since and ends it."""

    def __init__(self, query: StreamingQuery, on_batch: Callable[[int], None]) -> None:
        self._query = query
        self._on_batch = on_batch
        self._last: int | None = None
        self._stopped = threading.Event()
        self._thread = threading.Thread(
            target=self._follow, name=f"retrylib-progress-{query.name}", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()
        self._thread.join(_STOP_WAIT_SECONDS)

    def _follow(self) -> None:
        try:
            while not self._stopped.wait(_POLL_SECONDS) and self._query.isActive:
                self._take(self._query.lastProgress)
            # The batches of the last poll period, and those of a query that already ended.
            for progress in self._query.recentProgress:
                self._take(progress)
        except Exception as error:  # the server went away: the job's main loop reports it
            log.debug("reading the query's progress failed: %s", error)

    def _take(self, progress: StreamingQueryProgress | None) -> None:
        finished = finished_batch(progress)
        if finished is None or not self._new(finished):
            return
        if self._last is None or finished > self._last + 1:
            # Batches that ended before the first poll or between two: the query's recent
            # reports hold them, in order.
            for earlier in self._query.recentProgress:
                batch = finished_batch(earlier)
                if batch is not None and batch < finished and self._new(batch):
                    self._report(batch)
        self._report(finished)

    def _new(self, batch_id: int) -> bool:
        return self._last is None or batch_id > self._last

    def _report(self, batch_id: int) -> None:
        # The counts are in the server's line of the batch and in the metrics table: the
        # query's progress has none under Spark Connect (the batch function's write of the
        # batch runs apart from the query's own execution, whose observed metrics it fills).
        log.info("batch %d done on the Spark Connect server", batch_id)
        self._last = batch_id
        self._on_batch(batch_id)


def finished_batch(progress: StreamingQueryProgress | None) -> int | None:
    """The batch a progress report is of, or None when its trigger ran no batch (Spark also
    reports triggers that found no data)."""
    if progress is None or "addBatch" not in (progress.durationMs or {}):
        return None
    return progress.batchId
