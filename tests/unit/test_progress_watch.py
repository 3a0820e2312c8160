"""Which batch a Spark Connect client learns finished from the query's progress
(`retrylib.progress_watch`); no Spark."""

from __future__ import annotations

from types import SimpleNamespace

from retrylib.progress_watch import finished_batch


def test_a_trigger_that_ran_a_batch_names_it() -> None:
    ran = SimpleNamespace(batchId=7, durationMs={"addBatch": 812, "triggerExecution": 900})

    assert finished_batch(ran) == 7


def test_a_trigger_that_found_no_data_names_no_batch() -> None:
    idle = SimpleNamespace(batchId=8, durationMs={"latestOffset": 3, "triggerExecution": 3})

    assert finished_batch(idle) is None
    assert finished_batch(None) is None
