"""Per-batch metrics of a known run: the JSON log lines, Spark's progress reports and the
Delta metrics table agree with what the job did, and a replayed batch adds no second row.
"""

from __future__ import annotations

import json
import logging
import time

from helpers import produce, read_table

from retrylib.batch.metrics import METRICS_SCHEMA, metrics_struct, table_row
from retrylib.batch.result import BatchResult
from retrylib.config.table_ref import TableRef
from retrylib.job import start_query, stop_gracefully
from retrylib.sinks.tables import append_once


def test_metrics_lines_and_table_match_the_run(
    spark, bootstrap_servers, make_topic, write_config, caplog, tmp_path
):
    caplog.set_level(logging.INFO, logger="retrylib.metrics")
    topic = make_topic("metrics", partitions=2)
    records = (
        [(f"ok-{i}", "v") for i in range(4)]
        + [(f"flaky1-{i}", "v") for i in range(3)]  # fail once, succeed on the retry
        + [(f"bad-{i}", "v") for i in range(2)]  # non-retryable: dead-lettered at once
    )
    produce(bootstrap_servers, topic, records, partitions=2)
    config = write_config(
        [topic],
        retry={"delays": ["1s"], "max_attempts": 2},
        metrics={"table": f"{tmp_path}/metrics", "dead_letter_every": "0s"},
    )
    results: list[BatchResult] = []
    query, batch_commit = start_query(spark, config, on_result=results.append)
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline and query.isActive:
            done = sum(r.counters.get("succeeded", 0) for r in results)
            if done >= 7:
                break
            time.sleep(0.5)
    finally:
        stop_gracefully(query, batch_commit)
        batch_commit.close()
    observed = {
        progress["batchId"]: progress["observedMetrics"]["retrylib"].asDict()
        for progress in query.recentProgress
        if "retrylib" in (progress["observedMetrics"] or {})
    }

    lines = [
        json.loads(record.getMessage())
        for record in caplog.records
        if record.name == "retrylib.metrics"
    ]
    assert [line["batch_id"] for line in lines] == [r.batch_id for r in results]
    totals = {
        name: sum(line[name] for line in lines)
        for name in (
            "records_main",
            "records_retry",
            "succeeded",
            "output_rows",
            "retried",
            "dead_lettered",
            "duplicates_skipped",
        )
    }
    assert totals == {
        "records_main": 9,
        "records_retry": 3,
        "succeeded": 7,
        "output_rows": 7,
        "retried": 3,
        "dead_lettered": 2,
        "duplicates_skipped": 0,
    }
    assert sum(line["retried_by_tier"][0] for line in lines) == 3
    # Spark's progress reports carry the same counters (a StreamingQueryListener sees them).
    for line in lines:
        figures = observed[line["batch_id"]]
        assert {name: figures[name] for name in totals} == {name: line[name] for name in totals}
        assert figures["retried_tier_1"] == line["retried_by_tier"][0]
        assert figures["lateness_p50_ms_tier_1"] == line["lateness_p50_ms_by_tier"][0]
        assert figures["lateness_p99_ms_tier_1"] == line["lateness_p99_ms_by_tier"][0]
    # The three retries were handled after they were due, never before.
    retry_batches = [line for line in lines if line["records_retry"]]
    assert retry_batches and all(
        0 <= line["lateness_p50_ms_by_tier"][0] <= line["lateness_p99_ms_by_tier"][0] < 60_000
        for line in retry_batches
    )
    assert all(
        line["lateness_p50_ms_by_tier"] == [None] for line in lines if not line["records_retry"]
    )
    # A batch that sent retries leaves them waiting on the tier: their age is there.
    first_retries = next(line for line in lines if line["retried"])
    assert first_retries["oldest_waiting_ms_by_tier"][0] is not None
    assert lines[-1]["oldest_waiting_ms_by_tier"] == [None]  # every retry was handled
    assert all(line["duration_ms"] > 0 and line["replayed"] is False for line in lines)
    # Read from the dead-letter table after every batch ("0s"): the dead letters so far wait.
    dead_so_far = 0
    for line in lines:
        dead_so_far += line["dead_lettered"]
        assert line["dead_letters_waiting"] == dead_so_far
    assert 0 <= lines[-1]["oldest_dead_letter_age_ms"] < 120_000
    assert all(line["input_lag"][topic]["lag"] == 0 for line in lines)
    assert set(lines[-1]["input_lag"]) == {topic, *config.retry.tier_topics()}

    table = read_table(config.metrics.table)
    assert table.schema.names == METRICS_SCHEMA.names
    rows = sorted(table.to_pylist(), key=lambda row: row["batch_id"])
    assert [row["batch_id"] for row in rows] == [line["batch_id"] for line in lines]
    for row, line in zip(rows, lines, strict=True):
        assert row["records_main"] == line["records_main"]
        assert row["succeeded"] == line["succeeded"]
        assert row["retried_by_tier"] == line["retried_by_tier"]
        assert row["lateness_p99_ms_by_tier"] == line["lateness_p99_ms_by_tier"]
        assert row["oldest_waiting_ms_by_tier"] == line["oldest_waiting_ms_by_tier"]
        assert row["dead_letters_waiting"] == line["dead_letters_waiting"]
        lag = {
            item["topic"]: {"lag": item["lag"], "not_due": item["not_due"]}
            for item in row["input_lag"]
        }
        assert lag == line["input_lag"]

    # A replayed batch logs again but never adds a second row.
    replay = spark.createDataFrame([table_row(lines[-1])], metrics_struct())
    table_ref = TableRef.parse(config.metrics.table, "metrics.table")
    app_id, batch_id = f"{batch_commit.app_id}:metrics", lines[-1]["batch_id"]
    assert append_once(replay, table_ref, app_id=app_id, batch_id=batch_id) is False
    assert read_table(config.metrics.table).num_rows == len(lines)
