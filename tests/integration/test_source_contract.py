"""Which topics a job reads (a pattern too), where a new job starts, and what it does with
records Kafka deleted before it read them: `retrylib run` (its `main`, in this process on the
tests' Spark session: the command as a process is test_entrypoints.py's), with Spark's Kafka
connector and with retrylib's own source reading the main topics."""

from __future__ import annotations

import json
import subprocess
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

import pytest
from chispa import assert_df_equality
from confluent_kafka import TopicPartition
from helpers import (
    metrics_totals,
    produce,
    run_cli_completed,
    run_job_available_now,
    write_job_toml,
)

from retrylib.kafka.clients import ensure_topics, make_admin

HANDLERS_DIR = Path(__file__).parent / "handlers"
SOURCES = ["builtin", "python"]
ON_EVERY_SPARK = ["builtin", pytest.param("python", marks=pytest.mark.every_spark)]
"""The sources, the python one (the Python data source API) also on the oldest Spark line."""
OUTPUT_SCHEMA = "key STRING, value STRING, topic STRING, partition INT, offset BIGINT, attempt INT"


def run_job(
    capfd,
    tmp_path: Path,
    bootstrap: str,
    topic: str | None,
    source: str,
    as_process: bool = False,
    **kafka: object,
) -> subprocess.CompletedProcess[str]:
    """`retrylib run --available-now` of a job handling `topic` (None: the kafka options
    name the topics) with `job_handlers:by_key`: its exit code and output. In this process,
    or `as_process`: in a process of its own, whose log holds what Spark's Python workers
    log too (they log to the job's stderr only where the job started Spark)."""
    path = write_job_toml(
        tmp_path / "job.toml",
        topics=[topic] if topic else (),
        name=f"contract-{source}",
        bootstrap_servers=bootstrap,
        kafka={"source": source, "topics": [topic] if topic else None, **kafka},
        handler={
            "function": "job_handlers:by_key",
            "output_schema": OUTPUT_SCHEMA,
            "paths": [HANDLERS_DIR],
        },
        retry={"delays": ["1s"], "max_attempts": 2},
    )
    if as_process:
        return run_job_available_now(path)
    return run_cli_completed(capfd, "run", str(path), "--available-now")


def assert_output_keys(spark, tmp_path: Path, keys: list[str]) -> None:
    output = spark.read.format("delta").load(str(tmp_path / "out")).select("key")
    expected = spark.createDataFrame([(key,) for key in keys], output.schema)
    assert_df_equality(output, expected, ignore_row_order=True)


@pytest.mark.parametrize("source", ON_EVERY_SPARK)
def test_a_new_job_starts_at_a_time(spark, bootstrap_servers, make_topic, tmp_path, source, capfd):
    """Each partition starts at its first record at or after the time; partition 1, whose
    records are all older, starts at its end instead of failing the query."""
    topic = make_topic("since", partitions=2)
    produce(bootstrap_servers, topic, [(f"ok-old-{i}", "v") for i in range(6)], partitions=2)
    time.sleep(0.2)
    since = datetime.now(UTC)
    time.sleep(0.2)
    new = [(f"ok-new-{i}", "v") for i in range(4)]
    produce(bootstrap_servers, topic, new, partitions=1)

    done = run_job(
        capfd, tmp_path, bootstrap_servers, topic, source, starting_offsets=since.isoformat()
    )

    assert done.returncode == 0, done.stderr[-3000:]
    assert_output_keys(spark, tmp_path, [key for key, _ in new])


def produce_and_delete_the_first(bootstrap: str, topic: str, count: int, deleted: int) -> None:
    produce(bootstrap, topic, [(f"ok-{i}", "v") for i in range(count)], partitions=1)
    admin = make_admin(bootstrap, {})
    for future in admin.delete_records([TopicPartition(topic, 0, deleted)]).values():
        future.result(30)


@pytest.mark.parametrize("source", ON_EVERY_SPARK)
def test_records_deleted_before_the_read_are_skipped_with_a_warning_when_asked(
    spark, bootstrap_servers, make_topic, tmp_path, source, capfd
):
    """The job's offsets say 0, Kafka deleted 0..3: with kafka.fail_on_data_loss = false the
    job handles 4..9 and says what it lost (retrylib's reader also counts it)."""
    topic = make_topic("lost", partitions=1)
    produce_and_delete_the_first(bootstrap_servers, topic, 10, 4)

    done = run_job(
        capfd,
        tmp_path,
        bootstrap_servers,
        topic,
        source,
        as_process=source == "python",  # its reader's warning is in the log
        starting_offsets=json.dumps({topic: {"0": 0}}),
        fail_on_data_loss=False,
    )

    assert done.returncode == 0, done.stderr[-3000:]
    assert_output_keys(spark, tmp_path, [f"ok-{i}" for i in range(4, 10)])
    if source == "python":
        assert metrics_totals(done.stderr)["records_lost"] == 4
        assert f"records {topic}[0]@0..3 were deleted from Kafka" in done.stderr


@pytest.mark.every_spark
def test_records_deleted_before_the_read_fail_the_job_by_default(
    spark, bootstrap_servers, make_topic, tmp_path, capfd
):
    topic = make_topic("lost", partitions=1)
    produce_and_delete_the_first(bootstrap_servers, topic, 10, 4)

    done = run_job(
        capfd,
        tmp_path,
        bootstrap_servers,
        topic,
        "python",
        starting_offsets=json.dumps({topic: {"0": 0}}),
    )

    assert done.returncode != 0
    assert f"records {topic}[0]@0..3 were deleted from Kafka before they were read" in done.stderr
    assert "kafka.fail_on_data_loss = false skips them" in done.stderr
    assert_output_keys(spark, tmp_path, [])  # created at start, nothing appended


@pytest.mark.parametrize("source", SOURCES)
def test_a_pattern_job_reads_every_matching_topic_and_those_created_later(
    spark, bootstrap_servers, tmp_path, source, capfd
):
    prefix = f"pat-{uuid.uuid4().hex[:8]}"
    admin = make_admin(bootstrap_servers, {})
    ensure_topics(admin, {f"{prefix}-a": 2, f"{prefix}-b": 1}, create=True)
    produce(bootstrap_servers, f"{prefix}-a", [("ok-a0", "v"), ("ok-a1", "v"), ("flaky1-a", "v")])
    produce(bootstrap_servers, f"{prefix}-b", [("ok-b0", "v")])
    pattern = {"topic_pattern": f"{prefix}-[a-z]"}

    first = run_job(capfd, tmp_path, bootstrap_servers, None, source, **pattern)
    ensure_topics(admin, {f"{prefix}-c": 1}, create=True)
    produce(bootstrap_servers, f"{prefix}-c", [("ok-c0", "v")])
    time.sleep(1.5)  # flaky1-a's retry (1s tier) is due after this
    second = run_job(capfd, tmp_path, bootstrap_servers, None, source, **pattern)
    status = run_cli_completed(capfd, "status", str(tmp_path / "job.toml"), "--json")

    for done in (first, second, status):
        assert done.returncode == 0, done.stderr[-3000:]
    assert_output_keys(spark, tmp_path, ["ok-a0", "ok-a1", "flaky1-a", "ok-b0", "ok-c0"])
    main_topics = json.loads(status.stdout)["main_topics"]
    assert [(t["topic"], t["lag"]) for t in main_topics] == [
        (f"{prefix}-{name}", 0) for name in "abc"
    ]
