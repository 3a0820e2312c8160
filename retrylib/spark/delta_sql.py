"""What a classic session and a Spark Connect client do alike with a Delta table: read its
history (DESCRIBE HISTORY), create it through DataFrameWriterV2, and mark its commits.

Both need only Delta's SQL extension and catalog on the Spark side, no Delta Connect plugin.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

    from retrylib.config.table_ref import TableRef

# What Spark and Delta say when a table was created by someone else meanwhile.
_ALREADY_CREATED = ("TABLE_OR_VIEW_ALREADY_EXISTS", "DELTA_PATH_EXISTS", "already exists")
# What Delta and Spark say of a path that holds no Delta table.
_NOT_A_DELTA_PATH = ("DELTA_MISSING_DELTA_TABLE", "DELTA_TABLE_ONLY_OPERATION", "PATH_NOT_FOUND")


def commit_mark(app_id: str, batch_id: int) -> str:
    """The `userMetadata` of the commit that appends batch `batch_id` of `app_id`."""
    return json.dumps({"retrylib_app": app_id, "batch": batch_id}, sort_keys=True)


def history(spark: SparkSession, target: TableRef, limit: int | None = None) -> DataFrame:
    """The table's DESCRIBE HISTORY, newest first, its last `limit` commits when given."""
    return spark.sql(f"DESCRIBE HISTORY {target.sql_name}" + (f" LIMIT {limit}" if limit else ""))


def newest_version(spark: SparkSession, target: TableRef) -> int:
    """The latest version of the Delta table at `target`; raises Spark's `AnalysisException`
    when there is none (DELTA_MISSING_DELTA_TABLE)."""
    return int(history(spark, target, 1).select("version").first()[0])


def latest_version(spark: SparkSession, ref: TableRef) -> int | None:
    """The latest version of the Delta table at `ref` (its log's last commit), or None when
    a path holds no Delta table (missing, empty, or other files).

    Raises Spark's `AnalysisException` when a catalog name is no table.
    """
    from pyspark.errors import AnalysisException

    try:
        return newest_version(spark, ref.resolved())
    except AnalysisException as error:
        if ref.is_path and any(sign in str(error) for sign in _NOT_A_DELTA_PATH):
            return None
        raise


def create_through_writer(
    spark: SparkSession,
    target: TableRef,
    schema: StructType,
    partition_by: Sequence[str],
    properties: Mapping[str, str],
) -> None:
    """Create the Delta table `target` through DataFrameWriterV2, keeping the NOT NULL
    columns of `schema`; a table created meanwhile by someone else is left as it is."""
    from pyspark.errors import AnalysisException
    from pyspark.sql.functions import col

    writer = spark.createDataFrame([], schema).writeTo(target.sql_name).using("delta")
    if partition_by:
        writer = writer.partitionedBy(*(col(column) for column in partition_by))
    for key, value in properties.items():
        writer = writer.tableProperty(key, value)
    try:
        writer.create()
    except AnalysisException as error:
        if not any(sign in str(error) for sign in _ALREADY_CREATED):
            raise
