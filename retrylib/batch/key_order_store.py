"""The job's key queues (`retry.key_ordered`, see `retry.key_order`) on the driver.

They are kept in the checkpoint, a file per batch that changed them (`<N>.json`, the last
two kept: a file cut short by a crash, as HDFS may leave one, is passed over for the one
before), and in a local file that the source's planner reads when it plans the next batch.
After each batch the batch commit folds in the queues its tasks changed (`key_state` result rows,
staged with the batch's other decisions). A replayed batch that was folded in already is
not folded in twice; one that was not (a crash before) is folded in from its staging folder,
as the first run would.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession

from retrylib.retry.key_order import (
    KeyId,
    Queue,
    apply_changes,
    queues_from_json,
    queues_to_json,
    write_queues,
)
from retrylib.state.files import join, list_names, read_json, replace_json

log = logging.getLogger(__name__)


class KeyOrderStore:
    """The queues in checkpoint folder `folder`, mirrored to `state_file` for the planner."""

    def __init__(self, folder: str, state_file: Path) -> None:
        """`state_file`: a local file on the node of the source's planner (Spark's driver)."""
        self.folder = folder
        self.state_file = state_file
        self.queues: dict[KeyId, Queue] = {}
        self.batch_id: int | None = None

    def load(self, spark: SparkSession) -> None:
        """Take the queues the checkpoint holds, if any, and hand them to the planner."""
        stored = stored_queues(spark, self.folder)
        if stored is not None:
            self.batch_id, self.queues = stored
            log.info(
                "key order: %d key(s) waiting behind retries after batch %d",
                len(self.queues),
                self.batch_id,
            )
        write_queues(self.state_file, self._document())

    def after_batch(self, spark: SparkSession, manifest: dict[str, Any], batch_id: int) -> None:
        """Fold in the queues batch `batch_id` changed (its `key_state` rows in its staging
        folder)."""
        if self.batch_id is not None and self.batch_id >= batch_id:
            return  # a replay of a batch folded in before
        changed = manifest["rows"].get("key_state", 0)
        if changed:
            rows = (
                spark.read.parquet(manifest["staging"])
                .where("kind = 'key_state'")
                .select("key_state.*")
                .collect()
            )
            apply_changes(self.queues, (row.asDict() for row in rows))
        self.batch_id = batch_id
        if changed:
            document = self._document()
            replace_json(spark, join(self.folder, f"{batch_id}.json"), document)
            write_queues(self.state_file, document)

    def _document(self) -> dict[str, Any]:
        return {"batch_id": self.batch_id, "queues": queues_to_json(self.queues.items())}


def stored_queues(spark: SparkSession, folder: str) -> tuple[int, dict[KeyId, Queue]] | None:
    """The newest readable queues in checkpoint `folder` and the batch that left them, or
    None when no batch has changed any."""
    numbers = sorted(
        (int(name[:-5]) for name in list_names(spark, folder) if name[:-5].isdigit()),
        reverse=True,
    )
    for number in numbers:
        uri = join(folder, f"{number}.json")
        try:
            stored = read_json(spark, uri)
            return stored["batch_id"], queues_from_json(stored["queues"])
        except (ValueError, KeyError, TypeError) as e:  # cut short by a crash while written
            log.warning("key order: %s is unreadable (%s); taking the one before it", uri, e)
    return None
