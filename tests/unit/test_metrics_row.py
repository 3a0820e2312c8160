"""Metrics figures from a batch result, lag arithmetic and the checkpoint offset log. The
metrics table's once-per-batch append runs on Spark in `tests/integration/test_metrics_rows.py`.
"""

from __future__ import annotations

import pyarrow as pa
import pytest
from confluent_kafka import KafkaException
from helpers import metrics_job_config

from retrylib.batch.metrics import (
    METRICS_SCHEMA,
    input_lag,
    metrics_row,
    positions_after,
    table_row,
)
from retrylib.batch.result import BatchResult
from retrylib.kafka.reading import KafkaOffsets
from retrylib.state.checkpoint import Checkpoint


def result(batch_id: int = 4, **counters: int) -> BatchResult:
    return BatchResult(batch_id, False, counters, 5, True, True, 321)


def test_row_holds_every_figure():
    row = metrics_row(
        result(records_main=10, records_retry=3, succeeded=9, retried_tier_2=2, dead_lettered=1),
        job="orders",
        tiers=3,
        finished_ms=1_700_000_000_000,
        lag={"orders": {"lag": 4, "not_due": 0}},
    )

    assert row["batch_id"] == 4 and row["duration_ms"] == 321 and row["produced"] == 5
    assert (row["records_main"], row["records_retry"], row["succeeded"]) == (10, 3, 9)
    assert row["retried_by_tier"] == [0, 2, 0] and row["retried"] == 2
    assert row["duplicates_skipped"] == 0
    assert row["finished_at"] == "2023-11-14T22:13:20.000+00:00"
    assert pa.Table.from_pylist([table_row(row)], schema=METRICS_SCHEMA).num_rows == 1


def test_row_holds_lateness_and_waiting_per_tier():
    late = BatchResult(4, False, {}, 0, True, True, 321, {0: [120, 900], 2: [5, 7]})
    row = metrics_row(
        late, job="orders", tiers=3, finished_ms=0, lag=None, waiting=[4000, None, 10]
    )

    assert row["lateness_p50_ms_by_tier"] == [120, None, 5]
    assert row["lateness_p99_ms_by_tier"] == [900, None, 7]
    assert row["oldest_waiting_ms_by_tier"] == [4000, None, 10]
    table = pa.Table.from_pylist([table_row(row)], schema=METRICS_SCHEMA)
    assert table.column("lateness_p99_ms_by_tier").to_pylist() == [[900, None, 7]]


def test_row_holds_the_pause_and_the_dead_letters_waiting():
    row = metrics_row(
        result(),
        job="orders",
        tiers=1,
        finished_ms=0,
        lag=None,
        paused_ms=1500,
        dead_letters=(12, 5_400_000),
    )
    bare = metrics_row(result(), job="orders", tiers=1, finished_ms=0, lag=None)

    assert (row["paused_ms"], row["dead_letters_waiting"]) == (1500, 12)
    assert row["oldest_dead_letter_age_ms"] == 5_400_000
    assert (bare["paused_ms"], bare["dead_letters_waiting"]) == (None, None)
    assert bare["oldest_dead_letter_age_ms"] is None
    table = pa.Table.from_pylist([table_row(row), table_row(bare)], schema=METRICS_SCHEMA)
    assert table.column("dead_letters_waiting").to_pylist() == [12, None]


def test_row_counts_records_too_large_for_their_topic():
    counters = {"dead_lettered": 3, "dead_lettered_too_large": 1, "dead_letter_truncated": 2}
    row = metrics_row(result(**counters), job="orders", tiers=1, finished_ms=0, lag=None)

    assert (row["dead_lettered"], row["dead_lettered_too_large"]) == (3, 1)
    assert row["dead_letter_truncated"] == 2
    table = pa.Table.from_pylist([table_row(row)], schema=METRICS_SCHEMA)
    assert table.column("dead_lettered_too_large").to_pylist() == [1]


def test_batch_offsets_merges_every_source(tmp_path):
    cfg = metrics_job_config(tmp_path)
    offsets = tmp_path / "cp" / "spark" / "offsets"
    offsets.mkdir(parents=True)
    (offsets / "7").write_text(
        'v1\n{"batchWatermarkMs":0,"batchTimestampMs":1234,"conf":{}}\n'
        '{"orders":{"0":10,"1":12}}\n{"orders.m.retry.10s":{"0":3}}\n-\n'
    )

    end, triggered = Checkpoint(cfg.job.checkpoint).batch_offsets(None, 7)  # no Spark: local

    assert end == {("orders", 0): 10, ("orders", 1): 12, ("orders.m.retry.10s", 0): 3}
    assert triggered == 1234


class FakeKafka:
    """Offsets of one main partition and one tier partition (records 0..9, 6.. not due)."""

    def partitions(self, topics, pattern=None):
        return {t: [0] for t in topics if t in ("orders", "orders.m.retry.10s")}

    def latest(self, keys):
        return {k: 10 for k in keys}

    def earliest(self, keys):
        return {k: 0 for k in keys}

    def first_at(self, times):
        return {k: 6 for k in times}


def test_lag_splits_retry_topics_into_due_and_not_due(tmp_path):
    config = metrics_job_config(tmp_path)
    end = {("orders", 0): 7, ("orders.m.retry.10s", 0): 2}
    lag = input_lag(config, positions_after(config, end, FakeKafka()), FakeKafka(), 10**12)

    assert lag == {
        "orders": {"lag": 3, "not_due": 0},
        "orders.m.retry.10s": {"lag": 4, "not_due": 4},
    }


def test_the_job_kafka_options_reach_the_lookup_client():
    with pytest.raises(KafkaException, match="socket.timeout.ms"):
        KafkaOffsets("127.0.0.1:1", {"socket.timeout.ms": "not-a-number"})
