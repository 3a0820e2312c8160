"""The dead-letter table read and updated through Spark, for `retrylib redrive`: rows that a
SQL predicate picks, the redrives' claims, and UPDATEs run again when they lose a race with
another commit. The rows' format is `retrylib.sinks.dead_letter`'s.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any

from delta.exceptions import (
    ConcurrentAppendException,
    ConcurrentDeleteDeleteException,
    ConcurrentDeleteReadException,
    ConcurrentWriteException,
    DeltaConcurrentModificationException,
    MetadataChangedException,
    ProtocolChangedException,
)
from pyspark.sql import functions as F

from retrylib.config.table_ref import TableRef
from retrylib.retry.headers import REDRIVES
from retrylib.sinks.tables import read_table, sql_string, sql_timestamp, update_where

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

_COMMIT_ATTEMPTS = 5
COMMIT_CONFLICTS = (
    ConcurrentAppendException,
    ConcurrentDeleteReadException,
    ConcurrentDeleteDeleteException,
    ConcurrentWriteException,
    MetadataChangedException,
    ProtocolChangedException,
    DeltaConcurrentModificationException,
)
"""Delta's commit conflicts: the UPDATE committed nothing and may run again. PySpark raises
them as these classes once `delta.exceptions` is imported (importing it installs the
conversion from the JVM's exceptions)."""
SHOWN_COLUMNS = (
    "id",
    "dead_lettered_at",
    "error_class",
    "reason",
    "origin_topic",
    "origin_partition",
    "origin_offset",
    "redrive_id",
    "redrive_topic",
)
"""The columns `DeadLetterTable.rows` reads of each row: what `retrylib redrive` reports."""


WAITING = "redriven_at IS NULL"
"""Spark SQL: the row's record waits for a redrive (none has sent it back yet)."""


def redriven_at_least(count: int) -> str:
    """Spark SQL: the row's record was redriven `count` times or more (its `REDRIVES`
    header)."""
    return (
        f"coalesce(exists(headers, h -> h.key = {sql_string(REDRIVES)} AND "
        f"coalesce(try_cast(cast(h.value AS STRING) AS INT) >= {count}, false)), false)"
    )


class DeadLetterTable:
    """The dead-letter table, read and updated through Spark. Every read starts from the
    table's latest version, so it sees the UPDATEs made before it.
    """

    def __init__(self, spark: SparkSession, table: TableRef) -> None:
        self.spark = spark
        self.table = table

    def rows(self, predicate: str, *, full: bool = False) -> list[dict[str, Any]]:
        """The rows `predicate` picks, oldest first, as dicts of `SHOWN_COLUMNS` (and `key`,
        `value`, `headers` with `full`)."""
        columns = [*SHOWN_COLUMNS, *(("key", "value", "headers") if full else ())]
        frame = read_table(self.spark, self.table).where(predicate)
        return frame.select(*columns).orderBy("dead_lettered_at", "id").toArrow().to_pylist()

    def count(self, predicate: str) -> int:
        """How many rows `predicate` picks."""
        return read_table(self.spark, self.table).where(predicate).count()

    def waiting(self) -> tuple[int, datetime | None]:
        """How many rows are `WAITING`, and when the oldest of them was dead-lettered."""
        frame = read_table(self.spark, self.table).where(WAITING)
        [row] = frame.agg(F.count(F.lit(1)), F.min("dead_lettered_at")).collect()
        return row[0], row[1]

    def first(self, predicate: str, count: int) -> str:
        """`predicate` narrowed to the first `count` rows it picks in the order of `rows`: the
        rows up to the count-th's place in that order (a row dead-lettered later is not
        taken, however many come)."""
        ordered = read_table(self.spark, self.table).where(predicate)
        ordered = ordered.select("dead_lettered_at", "id").orderBy("dead_lettered_at", "id")
        last = ordered.offset(count - 1).limit(1).toArrow().to_pylist()
        if not last:  # fewer rows than `count`
            return predicate
        at, row_id = last[0]["dead_lettered_at"], sql_string(last[0]["id"])
        if at is None:  # Spark orders missing times first
            return f"{predicate} AND dead_lettered_at IS NULL AND id <= {row_id}"
        at = sql_timestamp(at)
        return (
            f"{predicate} AND (dead_lettered_at IS NULL OR dead_lettered_at < {at} OR "
            f"(dead_lettered_at = {at} AND id <= {row_id}))"
        )

    def claimed(self) -> dict[str, list[dict[str, Any]]]:
        """Rows claimed by a redrive but not confirmed, by redrive id."""
        claimed: dict[str, list[dict[str, Any]]] = {}
        for row in self.rows("redrive_id IS NOT NULL AND redriven_at IS NULL", full=True):
            claimed.setdefault(row["redrive_id"], []).append(row)
        return claimed

    def origin_topics(self, predicate: str) -> list[str]:
        """The distinct origin topics of the rows `predicate` picks (none when no row matches)."""
        frame = read_table(self.spark, self.table).where(predicate)
        return sorted(row[0] for row in frame.select("origin_topic").distinct().collect())

    def update(self, predicate: str, set_values: Mapping[str, str]) -> None:
        """UPDATE the rows `predicate` picks (`set_values` are SQL expressions), run again
        when a concurrent commit wins the race, at most `_COMMIT_ATTEMPTS` times in all.

        Raises the last conflict when every attempt lost one.
        """
        for attempt in range(1, _COMMIT_ATTEMPTS + 1):
            try:
                update_where(self.spark, self.table, predicate, set_values)
                return
            except COMMIT_CONFLICTS as e:
                if attempt == _COMMIT_ATTEMPTS:
                    raise
                log.info("UPDATE of %s lost a race (%s); again", self.table, type(e).__name__)
                time.sleep(0.2 * attempt)
