"""A classic Spark session's flavour (`Flavour`): Spark's JVM is this process's, reached
through py4j (`sparkContext`), and the query's batches run here."""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from retrylib.spark.delta_sql import create_through_writer

if TYPE_CHECKING:
    import threading
    from pathlib import Path

    from delta.tables import DeltaTable
    from pyspark import SparkContext
    from pyspark.sql import SparkSession
    from pyspark.sql.types import StructType

    from retrylib.config.table_ref import TableRef

log = logging.getLogger(__name__)

_BUILTIN_KAFKA = "org.apache.spark.sql.kafka010.KafkaSourceProvider"


class Classic:
    """What a classic session does where a Spark Connect client differs (`Connect`)."""

    runs_batches_here = True
    reaches_uris = True

    def default_parallelism(self, spark: SparkSession) -> int:
        return max(1, spark.sparkContext.defaultParallelism)

    def set_job_property(self, spark: SparkSession, key: str, value: str | None) -> None:
        spark.sparkContext.setLocalProperty(key, value)

    def quiet_logs(self, spark: SparkSession) -> None:
        spark.sparkContext.setLogLevel("WARN")

    def add_py_file(self, spark: SparkSession, path: Path) -> None:
        spark.sparkContext.addPyFile(str(path))

    def spark_context(self, spark: SparkSession) -> SparkContext | None:
        return spark.sparkContext

    def job_canceller(self, spark: SparkSession) -> Callable[[], None] | None:
        return functools.partial(_cancel_jobs, spark)

    def kafka_connector_available(self, spark: SparkSession) -> bool:
        """Asks Spark to resolve the "kafka" format as a query would: jars added with
        `--jars` are loaded by Spark's class loader, which a plain `Class.forName` from Py4J
        does not see."""
        jvm = spark.sparkContext._jvm
        try:
            found = jvm.org.apache.spark.sql.execution.datasources.DataSource.lookupDataSource(
                "kafka", spark._jsparkSession.sessionState().conf()
            )
        except Exception:
            return False
        return found.getName() == _BUILTIN_KAFKA

    def thread(
        self, spark: SparkSession, target: Callable[..., None], args: tuple[Any, ...]
    ) -> threading.Thread:
        from pyspark import InheritableThread

        return InheritableThread(target, args=args)

    def make_active(self, spark: SparkSession) -> None:
        # Delta computes some reads in the thread's JVM side with its active session (a table
        # state it started computing in its own pool and lost, as to a concurrent OPTIMIZE),
        # and fails without one.
        spark._jvm.SparkSession.setActiveSession(spark._jsparkSession)

    def use_pool(self, spark: SparkSession, pool: str) -> None:
        spark.sparkContext.setLocalProperty("spark.scheduler.pool", pool)

    def paths_are_local(self, spark: SparkSession) -> bool:
        """Where Spark's default file system (`fs.defaultFS`) is the local disk."""
        return _local_default(spark.sparkContext)

    def hadoop_file(self, spark: SparkSession, uri: str) -> tuple[Any, Any]:
        jvm = spark.sparkContext._jvm
        path = jvm.org.apache.hadoop.fs.Path(uri)
        return path.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration()), path

    def delta_path_exists(self, spark: SparkSession, target: TableRef) -> bool:
        from delta.tables import DeltaTable

        # Delta's cached log lookup: about 3 ms a call here, where DESCRIBE HISTORY takes
        # 150 ms, and the batch commit asks each batch for each table.
        return DeltaTable.isDeltaTable(spark, target.text)

    def create_delta_table(
        self,
        spark: SparkSession,
        target: TableRef,
        schema: StructType,
        partition_by: Sequence[str],
        properties: Mapping[str, str],
    ) -> None:
        """A path is created through Delta's table builder, which writes version 0 and
        nothing else: through DataFrameWriterV2 an empty DataFrame's write job came first,
        and a new job's first table took 6.1 s instead of 2.5 s (the next ones 0.8 s instead
        of 0.4 s; local[2], idle machine). A catalog name goes through DataFrameWriterV2:
        the builder takes no name of three parts (`catalog.db.t`)."""
        if not target.is_path:
            create_through_writer(spark, target, schema, partition_by, properties)
            return
        from delta.tables import DeltaTable

        builder = DeltaTable.createIfNotExists(spark).location(target.text).addColumns(schema)
        builder = builder.partitionedBy(*partition_by)
        for key, value in properties.items():
            builder = builder.property(key, value)
        builder.execute()

    def append_committed(
        self,
        spark: SparkSession,
        target: TableRef,
        app_id: str,
        batch_id: int,
        save: Callable[[], None],
    ) -> bool:
        """The outcome is read from the table rather than from the write, which returns
        nothing. A table version moving on alone is no proof (another app id may commit
        meanwhile), and the app id's txn version alone cannot tell this commit from an
        earlier one; together they can. Both reads are of the log and its checksum file
        (`_txn_version`), not of the table's state."""
        before = _latest_snapshot(spark, target)
        done = _txn_version(before, app_id)
        save()
        if done is not None and done >= batch_id:
            log.info(
                "batch %d of %s not appended to %s: the table holds its batch %d already",
                batch_id,
                app_id,
                target,
                done,
            )
            return False
        return _latest_snapshot(spark, target).version() > before.version()

    def committed_batch(self, spark: SparkSession, target: TableRef, app_id: str) -> int | None:
        return _txn_version(_latest_snapshot(spark, target), app_id)

    def prepare_append(self, spark: SparkSession, target: TableRef) -> None:
        """The writer's check reads the snapshot's `transactions` map, which reconstructs
        its state (three Spark jobs a new version); computed here, the append's own
        `DeltaLog.update` returns the same snapshot with the map in it, or waits on its lock
        while this thread computes it."""
        _latest_snapshot(spark, target).transactions()


def _cancel_jobs(spark: SparkSession) -> None:
    """Cancel every Spark job `spark` runs.

    What the cancelled tasks and Spark's call into the batch function then log, each a stack
    trace of the cancellation (some 270 lines), is left out: the stop's warning says it.
    """
    log4j = spark.sparkContext._jvm.org.apache.logging.log4j  # type: ignore[union-attr]
    # Every logger, not only the root that setLogLevel sets: some have levels of their own.
    log4j.core.config.Configurator.setAllLevels("", log4j.Level.FATAL)
    logging.getLogger("py4j.clientserver").setLevel(logging.CRITICAL)
    spark.sparkContext.cancelAllJobs()


@functools.lru_cache(maxsize=1)
def _local_default(context: SparkContext) -> bool:
    """Whether `context`'s default file system is the local disk: asked once per context (a
    few ms through py4j, where a batch reads and writes several files)."""
    default = context._jvm.org.apache.hadoop.fs.FileSystem.getDefaultUri(
        context._jsc.hadoopConfiguration()
    )
    return default.getScheme() in (None, "file")


def _latest_snapshot(spark: SparkSession, target: TableRef) -> Any:
    """The JVM `Snapshot` of the table's latest version, listed afresh from its log.

    No public API or SQL command exposes the transactions a table holds, so a classic
    session goes through py4j to the same `DeltaLog` the writer uses (stable from Delta 4.0
    to 4.4): `DeltaTable.deltaLog` (protected in Scala, public in bytecode) resolves path and
    catalog tables alike, and `DeltaLog.update(stalenessAcceptable=false, ...)` lists the log
    synchronously instead of handing back the snapshot it cached.
    """
    none = spark._jvm.scala.Option.empty()  # type: ignore[union-attr]
    return _delta_table(spark, target)._jdt.deltaLog().update(False, none, none)


def _txn_version(snapshot: Any, app_id: str) -> int | None:
    """The version `snapshot` holds for `app_id`, else None.

    Read from the version's checksum file (`<version>.crc`), which Delta writers keep with
    the table's app transactions in it: a millisecond, where the snapshot's `transactions`
    map reconstructs its state, three Spark jobs of 0.5-0.75 s per new version on local[2]
    that take executor cores from the routing tasks running beside the read. The map stays
    the answer where the file cannot give it: no checksum (a writer that keeps none), one
    without transactions, or a table with delta.setTransactionRetentionDuration, whose
    expired transactions the map drops as the writer's own check does.
    """
    checksum = snapshot.checksumOpt()
    if checksum.isDefined() and snapshot.minSetTransactionRetentionTimestamp().isEmpty():
        known = checksum.get().setTransactions()
        if known.isDefined():
            versions = [
                int(txn.version()) for txn in _java_list(known.get()) if txn.appId() == app_id
            ]
            return max(versions) if versions else None
    found = snapshot.transactions().get(app_id)
    return int(found.get()) if found.isDefined() else None


def _java_list(seq: Any) -> list[Any]:
    """A Scala `Seq`'s elements, through its iterator (py4j iterates no Scala collection)."""
    items, iterator = [], seq.iterator()
    while iterator.hasNext():
        items.append(iterator.next())
    return items


def _delta_table(spark: SparkSession, target: TableRef) -> DeltaTable:
    from delta.tables import DeltaTable

    if target.is_path:
        return DeltaTable.forPath(spark, target.text)
    return DeltaTable.forName(spark, target.text)
