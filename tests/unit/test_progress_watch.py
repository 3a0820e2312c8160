"""Which batch a Spark Connect client learns finished from the query's progress
(`retrylib.batch.progress_watch`); no Spark."""

from __future__ import annotations

from types import SimpleNamespace

from retrylib.batch.progress_watch import ProgressWatch, finished_batch


def test_a_trigger_that_ran_a_batch_names_it() -> None:
    ran = SimpleNamespace(batchId=7, durationMs={"addBatch": 812, "triggerExecution": 900})

    assert finished_batch(ran) == 7


def test_a_trigger_that_found_no_data_names_no_batch() -> None:
    idle = SimpleNamespace(batchId=8, durationMs={"latestOffset": 3, "triggerExecution": 3})

    assert finished_batch(idle) is None
    assert finished_batch(None) is None


def _ran(batch_id: int) -> SimpleNamespace:
    return SimpleNamespace(batchId=batch_id, durationMs={"addBatch": 5}, observedMetrics={})


class _Query:
    """A query that runs for `polls` reads of isActive, its progress as given."""

    name = "q"

    def __init__(self, polls: int, last, recent) -> None:
        self._polls = polls
        self.lastProgress = last
        self.recentProgress = recent

    @property
    def isActive(self) -> bool:
        self._polls -= 1
        return self._polls >= 0


def test_batches_that_ended_between_two_reads_are_reported_in_order_once() -> None:
    idle = SimpleNamespace(batchId=7, durationMs={"triggerExecution": 1}, observedMetrics={})
    query = _Query(polls=1, last=_ran(6), recent=[_ran(4), _ran(5), _ran(6), idle])
    seen: list[int] = []

    ProgressWatch(query, seen.append).stop()

    assert seen == [4, 5, 6]


def test_the_batches_of_a_query_that_already_ended_are_reported_when_it_stops() -> None:
    query = _Query(polls=0, last=None, recent=[_ran(0), _ran(1)])
    seen: list[int] = []

    ProgressWatch(query, seen.append).stop()

    assert seen == [0, 1]
