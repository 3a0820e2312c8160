"""Reading Delta tables back in tests: through Spark's Delta reader, as users read them."""

from __future__ import annotations

import pyarrow as pa
from pyspark.sql import SparkSession


def tests_session() -> SparkSession:
    """The test process's SparkSession (the `spark` fixture's, or one made like it)."""
    from retrylib.session import build_spark_session

    active = SparkSession.getActiveSession()
    if active is not None:
        return active
    return build_spark_session(
        "retrylib-tests",
        master="local[2]",
        extra={"spark.sql.shuffle.partitions": "2", "spark.ui.enabled": "false"},
    )


def read_table(table: str) -> pa.Table:
    """The current snapshot of the Delta table at path `table`, as an Arrow table."""
    return tests_session().read.format("delta").load(table).toArrow()
