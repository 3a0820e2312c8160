"""A handler job's table effects: a batch's output rows and dead-letter rows appended to their
Delta tables, each once.

Spark's Delta writer appends them with the app transaction (`txnAppId` = the checkpoint's
app id, `txnVersion` = batch id), so Delta skips the append of a batch the table already
holds (`sinks.tables.append_once`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from pyspark.sql import DataFrame

from retrylib.batch.effects import Made
from retrylib.batch.spark_errors import spark_error_reason, table_write_error
from retrylib.config.table_ref import TableRef
from retrylib.sinks.tables import append_once
from retrylib.steps import reached


@dataclass(frozen=True)
class TableAppend:
    """The effect that appends a batch's result rows of `kind` to `table`, the table of config
    key `key`, for the checkpoint's `app_id`; `evolve` lets the append add the columns the
    rows have and the table lacks. Build one with `output` or `dead_letter`."""

    kind: str
    key: str
    table: TableRef
    app_id: str
    evolve: bool
    appended: Callable[[int], None]  # reaches the step after the append (`retrylib.steps`)

    @classmethod
    def output(cls, table: TableRef, app_id: str, *, evolve: bool) -> TableAppend:
        """The output rows appended to `table` (`output.table`)."""
        return cls("output", "output.table", table, app_id, evolve, _after_output_commit)

    @classmethod
    def dead_letter(cls, table: TableRef, app_id: str) -> TableAppend:
        """The dead-letter rows appended to `table` (`dead_letter.table`)."""
        return cls(
            "dead_letter", "dead_letter.table", table, app_id, False, _after_dead_letter_commit
        )

    def make(self, decisions: DataFrame | None, manifest: Mapping[str, Any], batch_id: int) -> Made:
        """Append the batch's rows of this kind among `decisions`, once.

        Raises `TableWriteError` naming the table, its location and what to check when Spark
        cannot write it. The batch is not done then: Spark runs it again after a restart,
        from its manifest, and Delta's transaction keeps each append to one.
        """
        committed = False
        if decisions is not None:
            rows = decisions.where(f"kind = '{self.kind}'").select(f"{self.kind}.*")
            try:
                committed = append_once(
                    rows, self.table, app_id=self.app_id, batch_id=batch_id, evolve=self.evolve
                )
            except Exception as e:  # Spark's and the storage's errors: many classes, all fatal
                reason = spark_error_reason(e)
                raise table_write_error(batch_id, self.key, self.table, reason) from e
        self.appended(batch_id)
        return Made(committed=committed)


def _after_output_commit(batch_id: int) -> None:
    reached("after_output_commit", batch_id)


def _after_dead_letter_commit(batch_id: int) -> None:
    reached("after_dead_letter_commit", batch_id)
