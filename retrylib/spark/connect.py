"""What the job does differently in a Spark Connect session, where this side has no JVM.

A classic session reaches Spark's JVM through py4j (`sparkContext`); a Connect client only
sends plans and commands to a server. The same holds inside the job's `foreachBatch`
function when a Connect server runs it: there it gets a Connect session of its own.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def is_connect(spark: SparkSession) -> bool:
    """Whether `spark` is a Spark Connect session (no JVM on this side)."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


def default_parallelism(spark: SparkSession) -> int:
    """The cores Spark's tasks run on: `SparkContext.defaultParallelism`.

    A Connect session has no SparkContext; there the partition count of a `range` with
    none given answers (Spark gives it `spark.sql.leafNodeDefaultParallelism`, which is
    `defaultParallelism` unless set), for one small Spark job.
    """
    if not is_connect(spark):
        return max(1, spark.sparkContext.defaultParallelism)
    from pyspark.sql import functions as F

    partitions = spark.range(1 << 16).select(F.spark_partition_id().alias("partition"))
    return max(1, partitions.agg(F.max("partition")).first()[0] + 1)


def set_job_property(spark: SparkSession, key: str, value: str | None) -> None:
    """Give the Spark jobs this thread starts next the local property `key` (None: unset),
    which their tasks read with `TaskContext.getLocalProperty`.

    A Connect session cannot set local properties; it sets `key` as a SQL conf instead,
    which Spark copies into the local properties of each query's jobs (every conf whose
    name starts with "spark"), so `key` must start with "spark.".
    """
    if not is_connect(spark):
        spark.sparkContext.setLocalProperty(key, value)
    elif value is None:
        spark.conf.unset(key)
    else:
        spark.conf.set(key, value)
