"""Building the SparkSession the job runs in, and the one the tools read tables through.

With `SPARK_REMOTE` set (PySpark's own convention: `sc://host:port`) each is a Spark Connect
client of that server, which brings its own jars and settings. The user's jars and settings
(`RETRYLIB_SPARK_JARS`, `RETRYLIB_SPARK_CONF`: `retrylib/spark/extra.py`) go on every session
built here, as spark-submit.sh gives them to the job.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping
from pathlib import Path

import pyspark
from pyspark import SparkContext
from pyspark.sql import SparkSession

from retrylib.spark.extra import CONF, extra_conf, extra_jars
from retrylib.spark.flavour import flavour_of
from retrylib.spark.scheduling import pool_settings

log = logging.getLogger(__name__)

_QUIET_DEFAULTS = {
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.streaming.stopGracefullyOnShutdown": "false",
    # Arrow batches from the Kafka source are already bounded by the source.
    "spark.sql.execution.arrow.maxRecordsPerBatch": "10000",
}


def connect_server() -> str | None:
    """The Spark Connect server this process's sessions are clients of (`SPARK_REMOTE`), or
    None for a classic session."""
    return os.environ.get("SPARK_REMOTE") or None


def runs_on_cluster_spark() -> bool:
    """True when this process runs on a Spark it did not install from PyPI, which brings its
    own connector and Delta (Databricks, EMR), or was started by spark-submit (which was
    given the jars already)."""
    if os.environ.get("PYSPARK_GATEWAY_PORT"):
        return True
    home = os.environ.get("SPARK_HOME")
    return bool(home) and Path(home).resolve() != Path(pyspark.__file__).parent.resolve()


def build_spark_session(
    app_name: str, master: str | None = None, extra: Mapping[str, str] | None = None
) -> SparkSession:
    """Get or create the SparkSession, quiet (WARN) and with Python workers on this interpreter.

    `master` is only applied when given (spark-submit, clusters and a Spark Connect server
    set their own). On a Spark installed from PyPI (a laptop, CI) the session gets Spark's
    Kafka connector and Delta Lake from `retrylib.dev.jars` (fetched once); a cluster's
    Spark, spark-submit and a Spark Connect server bring their own. The user's jars
    (`RETRYLIB_SPARK_JARS`) go on a JVM this process starts, and the user's settings
    (`RETRYLIB_SPARK_CONF`) over retrylib's own; `extra` settings are applied last. The
    retrylib Kafka data source is registered on the session. Raises `JarsError` when the
    jars are needed and cannot be resolved, `ConfigError` for a malformed
    `RETRYLIB_SPARK_CONF`.
    """
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder.appName(app_name)
    remote = connect_server()
    if master and not remote:
        builder = builder.master(master)
    settings = dict(_QUIET_DEFAULTS)
    server = remote is not None and remote.startswith("sc://")
    jars: list[str] = []
    if not runs_on_cluster_spark() and not server:
        # Imported here: spark-submit.sh leaves the jar resolver out of what it ships, and
        # under spark-submit (which runs the driver from that bundle) it is never needed.
        from retrylib.dev.jars import DELTA_SQL_CONF, spark_jars

        jars = [str(jar) for jar in spark_jars()]
        settings.update(DELTA_SQL_CONF)
        # Delta rebuilds a table's state (to read its app transactions) in this many tasks;
        # its default of 50 is sized for clusters and costs local runs a second per append.
        settings["spark.databricks.delta.snapshotPartitions"] = "2"
    if not os.environ.get("PYSPARK_GATEWAY_PORT") and not server:
        # This process starts the JVM: the user's jars go on it (spark-submit.sh gave a
        # JVM it started them already; a Connect server brings its own).
        jars += [jar for jar in extra_jars() if jar not in jars]
    if jars:
        settings["spark.jars"] = ",".join(jars)
    if not server:
        settings.update(pool_settings())
    user_conf = extra_conf()
    settings.update(user_conf)
    settings.update(extra or {})  # the caller's settings win over retrylib's defaults
    for key, value in ({} if server else settings).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    if server:  # a running server takes only the settings a session may change
        for key, value in settings.items():
            if key in user_conf:
                _set_on_server(spark, key, value)
            elif spark.conf.isModifiable(key):
                spark.conf.set(key, value)
    flavour_of(spark).quiet_logs(spark)
    from retrylib.source.kafka_source import KafkaDataSource

    spark.dataSource.register(KafkaDataSource)
    return spark


def _set_on_server(spark: SparkSession, key: str, value: str) -> None:
    """Set a user's setting (`RETRYLIB_SPARK_CONF`) on a Spark Connect session; a server that
    refuses it (a setting fixed when the server starts) gets a warning naming it, not an
    error: the server may well be started with it."""
    try:
        spark.conf.set(key, value)
    except Exception as error:  # the server's refusal, whatever its class on this Spark
        log.warning(
            "%s: the Spark Connect server keeps its own %s (%s); set it where the server starts",
            CONF,
            key,
            str(error).splitlines()[0] if str(error) else type(error).__name__,
        )


def tool_session(app_name: str) -> SparkSession:
    """The SparkSession that `status`, `redrive` and `check --tables` read tables through.

    The running one when this process has one (a notebook, a test, a caller's job), with
    its settings untouched. Else a new one: under spark-submit or a cluster's Spark with the
    master that launched it; a client of the Spark Connect server `SPARK_REMOTE` names; on
    a PyPI pyspark `local[1]` without the UI, since one core starts fastest and these reads
    are small. Raises `JarsError` when Delta's jars are needed and cannot be resolved.
    """
    from retrylib.logs import spark_log_conf

    running = SparkSession.getActiveSession()
    if running is None and SparkContext._active_spark_context is not None:
        running = SparkSession.builder.getOrCreate()
    if running is not None:
        return running
    if runs_on_cluster_spark() or connect_server():
        return build_spark_session(app_name, extra=spark_log_conf())
    local = {"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "1"}
    return build_spark_session(app_name, master="local[1]", extra={**local, **spark_log_conf()})
