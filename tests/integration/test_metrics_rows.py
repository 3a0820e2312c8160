"""The metrics table through Spark: `MetricsRecorder` appends one row per batch, once. The
figures themselves are checked without Spark in `tests/unit/test_metrics_row.py`.
"""

from __future__ import annotations

from chispa import assert_df_equality
from helpers import metrics_job_config

from retrylib.batch.metrics import MetricsRecorder
from retrylib.batch.result import BatchResult
from retrylib.config.table_ref import TableRef
from retrylib.sinks.tables import read_table


def result(batch_id: int, **counters: int) -> BatchResult:
    return BatchResult(batch_id, False, counters, 5, True, True, 321)


def test_one_metrics_row_per_batch(spark, tmp_path):
    cfg = metrics_job_config(tmp_path)
    recorder = MetricsRecorder(cfg, "m-1", cfg.retry.tiers)
    recorder.prepare(spark)

    recorder.record(result(2, records_main=3, retried_tier_2=1))
    recorder.record(result(2, records_main=3, retried_tier_2=1))  # the batch replayed
    recorder.record(result(1, records_main=9))  # an earlier batch, committed already

    table = read_table(spark, TableRef.parse(cfg.metrics.table, "metrics.table"))
    expected = spark.createDataFrame(
        [("m", 2, 3, 1, [0, 1], None, 321)],
        "job STRING, batch_id BIGINT, records_main BIGINT, retried BIGINT, "
        "retried_by_tier ARRAY<BIGINT>, "
        "input_lag ARRAY<STRUCT<topic: STRING, lag: BIGINT, not_due: BIGINT>>, "
        "duration_ms BIGINT",
    )
    assert_df_equality(
        table.select(
            "job",
            "batch_id",
            "records_main",
            "retried",
            "retried_by_tier",
            "input_lag",
            "duration_ms",
        ),
        expected,
        ignore_nullable=True,
    )
