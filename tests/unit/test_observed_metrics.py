"""The names retrylib's figures take in Spark's progress reports (`observedMetrics`)."""

from __future__ import annotations

from retrylib.batch.metrics import OBSERVED_COUNTERS
from retrylib.batch.observed import metric_names


def test_every_counter_of_the_log_line_but_produced_is_observed():
    names = metric_names(OBSERVED_COUNTERS, 2)

    assert "produced" not in names
    assert {"records_main", "succeeded", "retried", "dead_lettered", "handler_ms"} <= set(names)
    assert names[-6:] == [
        "retried_tier_1",
        "retried_tier_2",
        "lateness_p50_ms_tier_1",
        "lateness_p99_ms_tier_1",
        "lateness_p50_ms_tier_2",
        "lateness_p99_ms_tier_2",
    ]
    assert len(names) == len(set(names))


def test_a_job_without_tiers_observes_its_counters_only():
    assert metric_names(("records_delayed", "forwarded"), 0) == ["records_delayed", "forwarded"]
