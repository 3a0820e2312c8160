"""Retries with delays and the dead-letter path, end to end against the broker and Delta."""

from __future__ import annotations

import logging
import time

import pytest
from chispa import assert_df_equality
from helpers import (
    produce,
    read_table,
    read_topic,
    run_available_now,
    run_until,
    settled_count,
    table_frame,
)

from retrylib.batch.result import BatchResult
from retrylib.job import start_query, stop_gracefully
from retrylib.kafka.clients import make_producer
from retrylib.retry.headers import split_headers

log = logging.getLogger(__name__)


def table_rows(path: str) -> list[dict]:
    return read_table(path).to_pylist()


@pytest.mark.parametrize(
    "source", [pytest.param("builtin", marks=pytest.mark.every_spark), "python"]
)
def test_outcomes_by_kind(spark, bootstrap_servers, make_topic, write_config, source):
    """Both main-topic readers: Spark's connector, and retrylib's ranges read in the tasks."""
    topic = make_topic("orders", partitions=3)
    keys = (
        [f"ok-{i}" for i in range(30)]
        + [f"flaky1-{i}" for i in range(10)]
        + [f"flaky2-{i}" for i in range(10)]
        + [f"always-{i}" for i in range(5)]
        + [f"bad-{i}" for i in range(5)]
        + [f"stop-{i}" for i in range(5)]
    )
    produce(bootstrap_servers, topic, [(k, f"v-{k}") for k in keys])
    # delays 1s, 2s; max_attempts 3; ValueError non-retryable
    config = write_config([topic], kafka={"source": source})

    run_until(spark, config, lambda: settled_count(config) >= len(keys))
    time.sleep(1)  # nothing more may arrive

    succeeding = [k for k in keys if k.split("-")[0] in ("ok", "flaky1", "flaky2")]
    expected_attempt = {"ok": 0, "flaky1": 1, "flaky2": 2}
    expected = spark.createDataFrame(
        [(k, f"v-{k}", topic, expected_attempt[k.split("-")[0]]) for k in succeeding],
        "key STRING, value STRING, topic STRING, attempt INT",
    )
    actual = table_frame(spark, config.output.table).select("key", "value", "topic", "attempt")
    assert_df_equality(actual, expected, ignore_row_order=True, ignore_nullable=True)

    dead = {row["key"].decode(): row for row in table_rows(config.dead_letter.table)}
    assert sorted(dead) == sorted(k for k in keys if k.split("-")[0] in ("always", "bad", "stop"))
    for key, row in dead.items():
        kind = key.split("-")[0]
        want = {
            "always": (3, "attempts_exhausted", "builtins.RuntimeError", "always fails"),
            "bad": (1, "non_retryable", "builtins.ValueError", "bad order"),
            "stop": (1, "non_retryable", "retrylib.errors.NonRetryable", "gave up"),
        }[kind]
        assert (row["attempts"], row["reason"], row["error_class"], row["error_message"]) == want
        assert row["origin_topic"] == topic and row["value"] == f"v-{key}".encode()
        assert "Traceback" in row["stack_trace"]
        assert row["first_failure"] <= row["last_failure"]

    dead_topic = read_topic(bootstrap_servers, config.dead_letter.topic)
    assert sorted(m.key().decode() for m in dead_topic) == sorted(dead)
    user, own = split_headers(dead_topic[0].headers())
    assert own["retrylib.dead_letter.reason"] in (b"attempts_exhausted", b"non_retryable")
    assert {"retrylib.id", "retrylib.attempts", "retrylib.error.stack_trace"} <= own.keys()


@pytest.mark.every_spark
def test_delays_are_honoured_and_lateness_is_bounded(
    spark, bootstrap_servers, make_topic, write_config, tmp_path
):
    timing_file = tmp_path / "failures.txt"
    topic = make_topic("orders", partitions=2)
    config = write_config(
        [topic], handler="timing_handlers:timed_by_key", retry={"delays": ["3s"], "max_attempts": 2}
    )
    keys = [f"timed-{i}" for i in range(6)]
    produce(bootstrap_servers, topic, [(k, str(timing_file)) for k in keys])

    results = run_until(spark, config, lambda: settled_count(config) >= len(keys))

    failed_at = dict(line.split() for line in timing_file.read_text().splitlines())
    handled = {row["key"]: float(row["value"]) for row in table_rows(config.output.table)}
    waits = {key: handled[key] - float(failed_at[key]) for key in keys}
    slowest_batch = max(r.duration_ms for r in results) / 1000
    lateness = sorted(wait - 3.0 for wait in waits.values())
    log.warning(
        "retry lateness after a 3s delay: min %.2fs max %.2fs (slowest batch %.2fs)",
        lateness[0],
        lateness[-1],
        slowest_batch,
    )
    # Due times are whole milliseconds (the job stamps the failure as Kafka does): the
    # handler's own float clock may read up to 1 ms past the stamp.
    assert lateness[0] >= -0.001, f"handled early: {waits}"
    assert lateness[-1] <= config.job.trigger_ms / 1000 + slowest_batch + 1.5, waits


def test_main_records_flow_while_retries_wait(spark, bootstrap_servers, make_topic, write_config):
    topic = make_topic("orders", partitions=2)
    config = write_config([topic], retry={"delays": ["30s"], "max_attempts": 2})
    produce(bootstrap_servers, topic, [("always-0", "v")])
    results: list[BatchResult] = []
    query, router = start_query(spark, config, on_result=results.append)
    try:
        deadline = time.monotonic() + 60
        while not any(r.counters.get("retried_tier_1") for r in results):
            assert time.monotonic() < deadline and query.isActive
            time.sleep(0.2)
        produce(bootstrap_servers, topic, [(f"ok-{i}", "v") for i in range(100)])
        # Counted from the batches' results: a table read each time would be a Spark job
        # beside the query's, on the same two task slots.
        while sum(r.counters.get("output_rows", 0) for r in results) < 100:
            assert time.monotonic() < deadline and query.isActive, "main records held up"
            time.sleep(0.2)
    finally:
        stop_gracefully(query, router)
        router.close()
    assert read_table(config.output.table).num_rows == 100
    assert read_table(config.dead_letter.table).num_rows == 0  # the retry is still waiting
    assert sum(r.counters.get("records_retry", 0) for r in results) == 0


def test_retry_after_and_unsigned_retry_records(spark, bootstrap_servers, make_topic, write_config):
    topic = make_topic("orders", partitions=1)
    config = write_config([topic], retry={"delays": ["1s"], "max_attempts": 3})
    tier_topic = config.retry.tiers[0].topics[topic]
    produce(bootstrap_servers, topic, [("after-0", "v")])
    run_available_now(spark, config)  # creates the tiers
    producer = make_producer(bootstrap_servers, {})
    producer.produce(
        tier_topic,
        key=b"garbage-0",
        value=b"x",
        partition=0,
        headers=[("retrylib.id", b"abc"), ("retrylib.attempt", b"one")],
        timestamp=int(time.time() * 1000) - 60_000,
    )
    producer.flush(10)

    run_until(spark, config, lambda: settled_count(config) >= 2)

    [row] = table_rows(config.output.table)
    assert (row["key"], row["attempt"]) == ("after-0", 1)
    [dead] = table_rows(config.dead_letter.table)
    assert (dead["key"], dead["reason"], dead["attempts"]) == (
        b"garbage-0",
        "unverified_retry_record",
        0,
    )
    assert "not signed by this job" in dead["error_message"]
    assert dead["source_topic"] == tier_topic
