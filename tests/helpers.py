"""Shared by the tests: a small job config, and Delta tables read back through Spark's Delta
reader, as users read them."""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
from pyspark.sql import SparkSession

from retrylib.config.loader import load_config
from retrylib.config.model import Config


def tests_session() -> SparkSession:
    """The test process's SparkSession (the `spark` fixture's, or one made like it)."""
    from retrylib.spark.session import build_spark_session

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


def table_frame(spark: SparkSession, path: str):
    """The Delta table at `path` as a DataFrame with the table's own column types (a frame
    made from pandas would widen INT to BIGINT on Spark 4.0)."""
    return spark.read.format("delta").load(path)


def metrics_job_config(tmp_path: Path) -> Config:
    """A job "m" on topic "orders" with a do-nothing handler, two tiers and a metrics table,
    everything under `tmp_path` (no broker is contacted to load it)."""
    (tmp_path / "h.py").write_text("def handle(record):\n    return None\n")
    path = tmp_path / "job.toml"
    path.write_text(f"""
[job]
name = "m"
checkpoint = "{tmp_path}/cp"
[kafka]
bootstrap_servers = "127.0.0.1:9092"
topics = ["orders"]
[handler]
function = "h:handle"
output_schema = "id STRING"
paths = ["{tmp_path}"]
[output]
table = "{tmp_path}/out"
[retry]
delays = ["10s", "1m"]
[metrics]
table = "{tmp_path}/metrics"
""")
    return load_config(path)


@contextlib.contextmanager
def refusing_writes(directory: str | Path) -> Iterator[None]:
    """While inside, no file can be created in `directory`, not even by root (as the tests
    run in containers): `chattr +i` as root, a mode without write permission otherwise.
    Restored on the way out.
    """
    if os.geteuid() == 0:
        subprocess.run(["chattr", "+i", str(directory)], check=True)
        try:
            yield
        finally:
            subprocess.run(["chattr", "-i", str(directory)], check=True)
        return
    mode = os.stat(directory).st_mode
    os.chmod(directory, 0o555)
    try:
        yield
    finally:
        os.chmod(directory, mode)
