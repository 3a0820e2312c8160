"""Where a batch's effects land, the control topic and the Delta tables, as the driver keeps
track of them.

- What a manifest records of them (`noted`): the control topic's end offset, before which no
  marker of the batch can be, and the tables the batch appends to.
- Their agreement with the checkpoint, checked at the first batch of a run, while its
  handler runs (`check_once`): a batch id below one the tables or the control topic already
  hold for this checkpoint's app id means the query runs from an older copy of the
  checkpoint; its effects would be skipped as "already committed", so the batch fails with
  an error instead (`table_checks`). The tables are made and their state read before the
  query starts (`read_ahead`), so that the query's own start overlaps them.
- What the appends' idempotent-write check reads of each table, computed beside each batch's
  routing (`prepare_appends`): Delta reconstructs a table's state for it, three Spark jobs a
  new version, which an append would otherwise run in line, adding 0.5-0.7 s to every
  batch that appends (local[2]).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping
from functools import partial
from typing import Any

from pyspark.sql import SparkSession

from retrylib.batch.at_once import Started
from retrylib.batch.table_checks import TableState, last_appends, manifest_tables, mismatch
from retrylib.config.table_ref import TableRef
from retrylib.errors import DamagedFile, RetrylibError
from retrylib.sinks.markers import ControlTopic
from retrylib.sinks.tables import committed_version, prepare_append
from retrylib.state.checkpoint import Checkpoint
from retrylib.state.files import read_json
from retrylib.task.results import OUTGOING_KIND

log = logging.getLogger(__name__)


class EffectTargets:
    """The control topic `control` and the `tables` a batch appends to (by the kind of result
    rows each takes) of the checkpoint `checkpoint` and its `app_id`; `later_tables`: tables
    appended to once the batch is done (the metrics table), prepared for it as the batch's
    own tables are."""

    def __init__(
        self,
        control: ControlTopic,
        tables: Mapping[str, TableRef],
        later_tables: tuple[TableRef, ...],
        checkpoint: Checkpoint,
        app_id: str,
    ) -> None:
        self._control = control
        self._tables = dict(tables)
        self._later_tables = later_tables
        self._checkpoint = checkpoint
        self._app_id = app_id
        self._checked = False
        self._made: Started | None = None
        self._read_ahead: Started | None = None
        self._preparing: Started | None = None

    def noted(self, rows: Mapping[str, int]) -> dict[str, Any]:
        """What a batch's manifest records of the targets, given its result rows by kind."""
        return {
            # Every marker of the batch comes after this offset: its produce starts later.
            "control_from": self._control.end_offset() if rows[OUTGOING_KIND] else None,
            "tables": manifest_tables(self._tables),
        }

    def read_ahead(self, spark: SparkSession, make_tables: Callable[[], None] | None) -> None:
        """Start, in threads, making the tables (`make_tables`: created if missing, checked
        against the config) and then reading which batch they hold, for the first batch's
        check. Cold, each costs seconds of Spark jobs per table, and the first batch would
        wait for them: started before the query, the query's own start overlaps them. The
        first batch routes no record before the tables are made (`made`), so an error there
        stops the job before any effect."""
        made = None if make_tables is None else Started(spark, make_tables)
        self._made = made

        def read() -> list[TableState]:
            if made is not None:
                made.result()
            self.prepare_appends(spark)
            return self._committed_batches(spark)

        self._read_ahead = Started(spark, read)

    def made(self) -> None:
        """Wait until the tables given to `read_ahead` are made; raise what stopped that."""
        made, self._made = self._made, None
        if made is not None:
            made.result()

    def prepare_appends(self, spark: SparkSession) -> None:
        """Start computing, in a thread, what the appends' check reads of each table
        (`sinks.tables.prepare_append`), unless the previous such thread still runs (the
        first batch's, cold, started by `read_ahead`). Nothing waits for it: an append that
        comes first waits on Delta's own lock while the thread computes, and one that fails
        says so itself."""
        if self._preparing is None or not self._preparing.running():
            self._preparing = Started(spark, partial(self._prepare, spark), background=True)

    def _prepare(self, spark: SparkSession) -> None:
        for table in (*self._tables.values(), *self._later_tables):
            try:
                prepare_append(spark, table)
            except Exception as error:  # the append reads it again, and says what failed
                log.debug("preparing the appends to %s failed: %s", table, error)

    def check_once(self, spark: SparkSession, batch_id: int) -> None:
        """At the first batch of a run, check that neither the tables nor the control topic
        are ahead of the checkpoint; later, nothing."""
        if not self._checked:
            self._check_agree(spark, batch_id)
            self._checked = True

    def _committed_batches(self, spark: SparkSession) -> list[TableState]:
        """Each table with the last batch it holds of this app id."""
        return [
            TableState(kind, table, committed_version(spark, table, self._app_id))
            for kind, table in self._tables.items()
        ]

    def _check_agree(self, spark: SparkSession, batch_id: int) -> None:
        """Raise `RetrylibError` when the control topic already holds a later batch of this
        checkpoint, or a table does, or a table lacks an earlier batch that appended to it
        (`table_checks`).

        Spark replays at most the last unfinished batch, so a produce marker is never above
        the batch that runs first after a start, unless the checkpoint is not the one the
        topics were written with.
        """
        produced = self._control.last_produced_batch()
        if produced is not None and produced > batch_id:
            raise RetrylibError(
                f"control topic {self._control.topic} holds the marker of batch {produced} of "
                f"{self._app_id}, but the query is running batch {batch_id}: the checkpoint is "
                "older than what it already produced. Restore the checkpoint, or start from a "
                "new one"
            )
        read_ahead, self._read_ahead = self._read_ahead, None
        states = self._committed_batches(spark) if read_ahead is None else read_ahead.result()
        appended = last_appends(
            self._earlier_manifests(spark, batch_id), {s.kind: s.table for s in states}
        )
        for state in states:
            error = mismatch(state, self._app_id, batch_id, appended.get(state.kind))
            if error is not None:
                raise RetrylibError(error)

    def _earlier_manifests(
        self, spark: SparkSession, batch_id: int
    ) -> Iterator[tuple[int, dict[str, Any]]]:
        """The readable manifests the checkpoint keeps of batches before `batch_id`, newest
        first, each read when asked for; an unreadable one of a finished batch is logged and
        left out."""
        for earlier in sorted(self._checkpoint.manifest_ids(spark), reverse=True):
            if earlier >= batch_id:
                continue
            uri = self._checkpoint.manifest(earlier)
            try:
                manifest = read_json(spark, uri)
            except DamagedFile as error:
                log.warning(
                    "the manifest of finished batch %d, %s, is damaged (%s): left out of the "
                    "tables' check",
                    earlier,
                    uri,
                    error.reason,
                )
                continue
            if isinstance(manifest, dict):
                yield earlier, manifest
