"""Building the SparkSession the job runs in."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping

from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

_QUIET_DEFAULTS = {
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.streaming.stopGracefullyOnShutdown": "false",
    # Arrow batches from the Kafka source are already bounded by the source.
    "spark.sql.execution.arrow.maxRecordsPerBatch": "10000",
}


def build_spark_session(
    app_name: str, master: str | None = None, extra: Mapping[str, str] | None = None
) -> SparkSession:
    """Get or create the SparkSession, quiet (WARN) and with Python workers on this interpreter.

    `master` is only applied when given (spark-submit and clusters set their own).
    The retrylib Kafka data source is registered on the session.
    """
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder.appName(app_name)
    if master:
        builder = builder.master(master)
    for key, value in {**_QUIET_DEFAULTS, **dict(extra or {})}.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    from retrylib.kafka_source import KafkaDataSource

    spark.dataSource.register(KafkaDataSource)
    return spark
