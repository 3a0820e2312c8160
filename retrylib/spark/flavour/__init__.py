"""What differs between a classic Spark session and a Spark Connect client, in one place.

A classic session reaches Spark's JVM through py4j (`sparkContext`); a Connect client only
sends plans and commands to a server. The same holds inside the job's `foreachBatch`
function when a Connect server runs it: there it gets a Connect session of its own.

`flavour_of(spark)` is the one place that tells the two apart; the rest of retrylib asks the
`Flavour` it returns for what differs. `Classic` (classic.py) and `Connect` (connect.py)
implement it, each importing PySpark's modules only in the methods that need them, so that
importing this package costs what importing two small modules does.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from retrylib.spark.flavour.classic import Classic
from retrylib.spark.flavour.connect import Connect

if TYPE_CHECKING:
    import threading
    from pathlib import Path

    from pyspark import SparkContext
    from pyspark.sql import SparkSession
    from pyspark.sql.types import StructType

    from retrylib.config.table_ref import TableRef


class Flavour(Protocol):
    """What the job does differently in a classic session and through Spark Connect."""

    runs_batches_here: bool
    """Whether the query's `foreachBatch` function runs in this process (a Connect server
    runs it in a Python process of its own)."""

    reaches_uris: bool
    """Whether this process reads and writes URIs (`s3a://`, `hdfs://`) itself, through
    Hadoop's FileSystem in the session's JVM."""

    def default_parallelism(self, spark: SparkSession) -> int:
        """The cores Spark's tasks run on: `SparkContext.defaultParallelism`."""
        ...

    def set_job_property(self, spark: SparkSession, key: str, value: str | None) -> None:
        """Give the Spark jobs this thread starts next the local property `key` (None:
        unset), which their tasks read with `TaskContext.getLocalProperty`; `key` starts
        with "spark."."""
        ...

    def quiet_logs(self, spark: SparkSession) -> None:
        """Set the session's Spark log level to WARN where the level is this process's."""
        ...

    def add_py_file(self, spark: SparkSession, path: Path) -> None:
        """Put `path` on the Python path of every executor."""
        ...

    def spark_context(self, spark: SparkSession) -> SparkContext | None:
        """This process's SparkContext, its way to the driver JVM; None where that JVM is
        out of reach."""
        ...

    def job_canceller(self, spark: SparkSession) -> Callable[[], None] | None:
        """What cancels every Spark job `spark` runs (a batch's, at a stop past its bound),
        or None where a session cannot."""
        ...

    def kafka_connector_available(self, spark: SparkSession) -> bool:
        """Whether Spark's own Kafka connector is on the classpath."""
        ...

    def thread(
        self, spark: SparkSession, target: Callable[..., None], args: tuple[Any, ...]
    ) -> threading.Thread:
        """A thread (not started) that runs `target(*args)` with this thread's Spark local
        properties, or session tags, so that stopping a query cancels its jobs too."""
        ...

    def make_active(self, spark: SparkSession) -> None:
        """Make `spark` the active session of this thread's side of the JVM, if any."""
        ...

    def use_pool(self, spark: SparkSession, pool: str) -> None:
        """Have the Spark jobs this thread starts from now on run in scheduler pool `pool`
        (`retrylib.spark.scheduling`), where the session's scheduler has pools."""
        ...

    def paths_are_local(self, spark: SparkSession) -> bool:
        """Whether a plain path (no URI) is a file on this machine's disk."""
        ...

    def hadoop_file(self, spark: SparkSession, uri: str) -> tuple[Any, Any]:
        """The Hadoop FileSystem holding `uri`, and `uri` as a Hadoop Path."""
        ...

    def delta_path_exists(self, spark: SparkSession, target: TableRef) -> bool:
        """Whether the path `target` holds a Delta table."""
        ...

    def create_delta_table(
        self,
        spark: SparkSession,
        target: TableRef,
        schema: StructType,
        partition_by: Sequence[str],
        properties: Mapping[str, str],
    ) -> None:
        """Create the Delta table `target` unless someone created it meanwhile."""
        ...

    def append_committed(
        self,
        spark: SparkSession,
        target: TableRef,
        app_id: str,
        batch_id: int,
        save: Callable[[], None],
    ) -> bool:
        """Run `save`, an append of batch `batch_id` of `app_id` to `target`; whether it
        committed a new table version (False: Delta skipped it, the table holds the batch)."""
        ...

    def committed_batch(self, spark: SparkSession, target: TableRef, app_id: str) -> int | None:
        """The last batch the existing table `target` holds for `app_id`, or None."""
        ...

    def prepare_append(self, spark: SparkSession, target: TableRef) -> None:
        """Have Delta compute what its idempotent-write check on the existing table `target`
        reads, so that an append started later finds it ready (nothing where the appends
        run elsewhere)."""
        ...


_CLASSIC = Classic()
_CONNECT = Connect()


def flavour_of(spark: SparkSession) -> Flavour:
    """The flavour of `spark`: `Connect` for a Spark Connect session, else `Classic`."""
    return _CONNECT if type(spark).__module__.startswith("pyspark.sql.connect") else _CLASSIC
