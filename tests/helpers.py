"""Shared by the tests: a small job config, Delta tables read back through Spark's Delta
reader, as users read them, and topics read back from Kafka."""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
from confluent_kafka import Message
from pyspark.sql import SparkSession

from retrylib.config.loader import load_config
from retrylib.config.model import Config
from retrylib.kafka.clients import make_consumer, topic_partitions
from retrylib.kafka.reading import READ_TO_END_OPTIONS, ReadToEnd


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


def read_topic(
    bootstrap: str, topic: str, *, isolation: str = "read_committed", timeout_s: float = 60.0
) -> list[Message]:
    """Every record of `topic` (none when it does not exist) that a reader with `isolation`
    sees, up to the end offsets of when the read starts, in offset order per partition.

    Fails the test when the topic is not read to its end within `timeout_s`.
    """
    consumer = make_consumer(bootstrap, {**READ_TO_END_OPTIONS, "isolation.level": isolation})
    try:
        partitions = topic_partitions(consumer, [topic]).get(topic, [])
        read = ReadToEnd.from_earliest(consumer, [(topic, p) for p in partitions])
        messages = list(read.messages(timeout_s))
    finally:
        consumer.close()
    assert not read.unfinished, f"{topic} not read to its end in {timeout_s:.0f}s"
    return messages
