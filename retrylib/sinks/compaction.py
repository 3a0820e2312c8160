"""Scheduled compaction of the job's Delta tables (`[output] optimize_every`).

Every batch that writes a table adds at least one small file to it (output, dead-letter and
metrics tables alike), so a job that runs for weeks leaves tables of many thousands of small
files, which every reader of the table pays for. With `optimize_every` set, the driver runs
Delta's OPTIMIZE (bin-packing compaction) on each of those tables once that long has passed
since the last run, right after a batch's commits. The time of the last run is kept in the
checkpoint (`<checkpoint>/retrylib/compaction.json`), so a restart does not reset the clock;
the clock starts with the first batch of a new checkpoint.

Compaction never fails a batch: a table that cannot be compacted is logged as a warning and
tried again one period later.

OPTIMIZE commits a new table version that removes small files and adds their rows back in
larger ones. Here it runs on the driver's batch thread, after the batch's appends and before
the next batch's, so it never runs beside one of the job's own appends: none of the job's
commits can conflict with it, and `tables.append_once`, which reads the table
version before and after its write, never sees a compaction commit in between. Another
process compacting the same tables relies on Delta's conflict checks instead.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from retrylib.config.durations import format_duration
from retrylib.config.table_ref import TableRef
from retrylib.sinks.tables import compact
from retrylib.state.files import read_json, replace_json

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)


def compaction_due(last_ms: int | None, now_ms: int, every_ms: int) -> bool:
    """Whether the tables should be compacted now, `every_ms` after the last time `last_ms`.

    False when there is no last time (the caller starts the clock then). True when the clock
    reads earlier than `last_ms`: it was set back, and waiting for it to catch up would put
    compaction off for as long as it was set back.
    """
    if last_ms is None:
        return False
    return now_ms - last_ms >= every_ms or now_ms < last_ms


class Compactor:
    """Compacts `tables` ((what, table) pairs: "output", "dead-letter", ...) every `every_ms`.

    The last time is kept in the file `state_uri` (`Checkpoint.compaction`). Only the driver
    calls it, between batches.
    """

    def __init__(
        self, state_uri: str, every_ms: int, tables: Sequence[tuple[str, TableRef]]
    ) -> None:
        self._uri = state_uri
        self._every_ms = every_ms
        self._tables = tuple(tables)
        self._last_ms: int | None = None
        self._loaded = False

    def after_batch(self, spark: SparkSession, now_ms: int | None = None) -> bool:
        """Compact every table if the period has passed; True when a compaction ran.

        Never raises: any failure is logged as a warning.
        """
        now_ms = int(time.time() * 1000) if now_ms is None else now_ms
        try:
            last_ms = self._last(spark)
            if last_ms is None:
                self._record(spark, now_ms)
                return False
            if not compaction_due(last_ms, now_ms, self._every_ms):
                return False
            for what, table in self._tables:
                self._compact(spark, what, table)
            self._record(spark, now_ms)
            return True
        except Exception as e:
            log.warning("scheduled compaction not done: %s", e)
            return False

    def _compact(self, spark: SparkSession, what: str, table: TableRef) -> None:
        started = time.monotonic()
        try:
            removed, added = compact(spark, table)
        except Exception as e:
            log.warning(
                "compacting the %s table %s failed (tried again in %s; the batch is not "
                "affected): %s",
                what,
                table,
                format_duration(self._every_ms),
                e,
            )
            return
        log.info(
            "compacted the %s table %s: %d files into %d in %.1fs",
            what,
            table,
            removed,
            added,
            time.monotonic() - started,
        )

    def _last(self, spark: SparkSession) -> int | None:
        if not self._loaded:
            try:
                stored = read_json(spark, self._uri)
            except ValueError as e:  # a write cut short (HDFS): start the clock again
                log.warning("unreadable %s (%s); the compaction clock starts now", self._uri, e)
                stored = None
            self._last_ms = None if stored is None else int(stored["last_ms"])
            self._loaded = True
        return self._last_ms

    def _record(self, spark: SparkSession, now_ms: int) -> None:
        replace_json(spark, self._uri, {"last_ms": now_ms})
        self._last_ms = now_ms
