"""A Spark Connect client's flavour (`Flavour`): no JVM on this side, only plans and
commands sent to a server, which runs the query's batches in a Python process of its own."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from retrylib.errors import RetrylibError
from retrylib.spark.delta_sql import (
    commit_mark,
    create_through_writer,
    history,
    latest_version,
    newest_version,
)

if TYPE_CHECKING:
    import threading
    from pathlib import Path

    from pyspark import SparkContext
    from pyspark.sql import SparkSession
    from pyspark.sql.types import StructType

    from retrylib.config.table_ref import TableRef

log = logging.getLogger(__name__)

# How many of a table's last commits are looked at first for the job's own.
_RECENT_COMMITS = 100


class Connect:
    """What a Spark Connect client does where a classic session differs (`Classic`)."""

    runs_batches_here = False
    reaches_uris = False

    def default_parallelism(self, spark: SparkSession) -> int:
        """With no SparkContext, the partition count of a `range` with none given answers
        (Spark gives it `spark.sql.leafNodeDefaultParallelism`, which is
        `defaultParallelism` unless set), for one small Spark job."""
        from pyspark.sql import functions as F

        partitions = spark.range(1 << 16).select(F.spark_partition_id().alias("partition"))
        return max(1, partitions.agg(F.max("partition")).first()[0] + 1)

    def set_job_property(self, spark: SparkSession, key: str, value: str | None) -> None:
        """A Connect session cannot set local properties; it sets `key` as a SQL conf
        instead, which Spark copies into the local properties of each query's jobs (every
        conf whose name starts with "spark")."""
        if value is None:
            spark.conf.unset(key)
        else:
            spark.conf.set(key, value)

    def quiet_logs(self, spark: SparkSession) -> None:
        """A Connect server's log level is its own."""

    def add_py_file(self, spark: SparkSession, path: Path) -> None:
        """Uploaded to the server as an artifact of the session."""
        spark.addArtifacts(str(path), pyfile=True)

    def spark_context(self, spark: SparkSession) -> SparkContext | None:
        """None: the server's JVM is out of reach, and no child of this process."""
        return None

    def job_canceller(self, spark: SparkSession) -> Callable[[], None] | None:
        return None

    def kafka_connector_available(self, spark: SparkSession) -> bool:
        """Asks the server for the schema of a Kafka stream (no broker is asked: the schema
        is fixed)."""
        from pyspark.errors import PySparkException

        kafka = (
            spark.readStream.format("kafka")
            .option("subscribe", "retrylib-probe")
            .option("kafka.bootstrap.servers", "localhost:9")
        )
        try:
            return bool(kafka.load().schema)
        except PySparkException as error:
            if error.getCondition() == "DATA_SOURCE_NOT_FOUND":
                return False
            raise

    def thread(
        self, spark: SparkSession, target: Callable[..., None], args: tuple[Any, ...]
    ) -> threading.Thread:
        """The thread carries `spark`'s tags."""
        from pyspark import InheritableThread

        return InheritableThread(target, args=args, session=spark)

    def make_active(self, spark: SparkSession) -> None:
        """No JVM side to make it active in."""

    def use_pool(self, spark: SparkSession, pool: str) -> None:
        """The server schedules its jobs as it was started to."""

    def paths_are_local(self, spark: SparkSession) -> bool:
        """Always: the client shares its paths with the server, as /Volumes/... on
        Databricks."""
        return True

    def hadoop_file(self, spark: SparkSession, uri: str) -> tuple[Any, Any]:
        raise RetrylibError(
            f"{uri}: through Spark Connect the checkpoint (job.checkpoint) must be a path of a "
            "file system the client and the server share, such as /Volumes/... on Databricks: "
            "a URI needs Hadoop's FileSystem, which a Spark Connect client cannot reach"
        )

    def delta_path_exists(self, spark: SparkSession, target: TableRef) -> bool:
        # No DeltaTable API without Delta's Connect plugin on the server.
        return latest_version(spark, target) is not None

    def create_delta_table(
        self,
        spark: SparkSession,
        target: TableRef,
        schema: StructType,
        partition_by: Sequence[str],
        properties: Mapping[str, str],
    ) -> None:
        """Through DataFrameWriterV2: Delta's table builder needs Delta's Connect plugin on
        the server."""
        create_through_writer(spark, target, schema, partition_by, properties)

    def append_committed(
        self,
        spark: SparkSession,
        target: TableRef,
        app_id: str,
        batch_id: int,
        save: Callable[[], None],
    ) -> bool:
        """No JVM to read the table's txn map through: the commit is told by its mark."""
        before_version = newest_version(spark, target)
        save()
        committed = _marked_since(spark, target, before_version, commit_mark(app_id, batch_id))
        if not committed:
            log.info(
                "batch %d of %s not appended to %s: the table holds it", batch_id, app_id, target
            )
        return committed

    def committed_batch(self, spark: SparkSession, target: TableRef, app_id: str) -> int | None:
        """The batch of the latest commit marked with `app_id` (`commit_mark`) that the
        table's history still holds."""
        return _last_marked_batch(spark, target, app_id)

    def prepare_append(self, spark: SparkSession, target: TableRef) -> None:
        """The appends run on the server, whose JVM this client cannot reach."""


def _marked_since(spark: SparkSession, target: TableRef, version: int, mark: str) -> bool:
    """Whether a commit after `version` carries `mark`."""
    from pyspark.sql import functions as F

    recent = history(spark, target, _RECENT_COMMITS).where(F.col("version") > version)
    return recent.where(F.col("userMetadata") == mark).limit(1).count() > 0


def _last_marked_batch(spark: SparkSession, target: TableRef, app_id: str) -> int | None:
    """The batch of the newest commit marked with `app_id`, looking at the last commits
    first and at the whole history only when they hold none."""
    from pyspark.sql import functions as F

    recent = history(spark, target, _RECENT_COMMITS).select("version", "userMetadata").collect()
    recent.sort(key=lambda row: row.version, reverse=True)
    batches = [_marked_batch(row.userMetadata, app_id) for row in recent]
    found = next((batch for batch in batches if batch is not None), None)
    if found is not None or len(recent) < _RECENT_COMMITS:
        return found
    marked = (
        history(spark, target)
        .where(F.get_json_object("userMetadata", "$.retrylib_app") == app_id)
        .orderBy(F.col("version").desc())
        .select(F.get_json_object("userMetadata", "$.batch").cast("long"))
        .first()
    )
    return None if marked is None else int(marked[0])


def _marked_batch(user_metadata: str | None, app_id: str) -> int | None:
    """The batch a commit's `userMetadata` marks as written by `app_id` (`commit_mark`)."""
    try:
        mark = json.loads(user_metadata or "")
    except ValueError:
        return None
    if not isinstance(mark, dict) or mark.get("retrylib_app") != app_id:
        return None
    batch = mark.get("batch")
    return batch if isinstance(batch, int) else None
