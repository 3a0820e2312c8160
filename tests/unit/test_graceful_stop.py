"""`stop_gracefully`: the stop comes once the batch running has finished, or past its bound
once the batch is cancelled, and says so."""

from __future__ import annotations

import logging
import threading

from retrylib.job import stop_gracefully


class Progress:
    def __init__(self, batch_id: int) -> None:
        self.batchId = batch_id


class Query:
    """A streaming query whose trigger stays active for `busy_polls` status reads, whose
    last progress names batch `recorded`."""

    def __init__(self, busy_polls: int, recorded: int = 6) -> None:
        self.isActive = True
        self.busy_polls = busy_polls
        self.stopped = False
        self.recorded = recorded
        self.error_when_stopped: Exception | None = None
        self.error: Exception | None = None

    @property
    def lastProgress(self) -> Progress:
        return Progress(self.recorded)

    @property
    def status(self) -> dict:
        self.busy_polls -= 1
        return {"isTriggerActive": self.busy_polls >= 0}

    def stop(self) -> None:
        self.stopped = True
        self.isActive = False
        self.error = self.error_when_stopped

    def exception(self) -> Exception | None:
        return self.error


class BatchCommit:
    def __init__(self) -> None:
        self.batch_finished = threading.Event()
        self.last_finished: int | None = 6


def test_a_batch_that_finished_while_spark_still_commits_it_is_not_cut_short(caplog):
    query, batch_commit = Query(busy_polls=10**6), BatchCommit()  # the trigger active throughout
    threading.Timer(
        0.2, lambda: (setattr(batch_commit, "last_finished", 7), batch_commit.batch_finished.set())
    ).start()
    threading.Timer(0.5, lambda: setattr(query, "recorded", 7)).start()

    with caplog.at_level(logging.INFO, logger="retrylib.job"):
        stop_gracefully(query, batch_commit, timeout=30)

    assert query.stopped
    assert caplog.messages == ["stopped after batch 7; the next start goes on from there"]


def test_the_stop_waits_for_spark_to_record_the_finished_batch():
    """Stopping while Spark writes the batch's commit log would interrupt the write and
    leave the batch to be replayed."""
    query, batch_commit = Query(busy_polls=10**6), BatchCommit()
    batch_commit.last_finished = 7
    batch_commit.batch_finished.set()  # cleared by the stop: a batch finishing before it counts not
    stopped_when_recorded = []
    query.stop = lambda: stopped_when_recorded.append(query.recorded)

    threading.Timer(0.1, batch_commit.batch_finished.set).start()
    threading.Timer(0.4, lambda: setattr(query, "recorded", 7)).start()
    stop_gracefully(query, batch_commit, timeout=30)

    assert stopped_when_recorded == [7]


def test_a_batch_still_running_at_the_bound_is_named_as_cut_short(caplog):
    query, batch_commit = Query(busy_polls=10**6), BatchCommit()

    with caplog.at_level(logging.INFO, logger="retrylib.job"):
        stop_gracefully(query, batch_commit, timeout=0.2)

    assert query.stopped
    assert caplog.messages == [
        "stopped after batch 6; the batch running did not finish within 0.2s and runs again "
        "at the next start, committing nothing twice"
    ]


def test_with_no_batch_running_it_stops_at_once(caplog):
    query, batch_commit = Query(busy_polls=0), BatchCommit()

    with caplog.at_level(logging.INFO, logger="retrylib.job"):
        stop_gracefully(query, batch_commit, timeout=30)

    assert query.stopped
    assert caplog.messages == ["stopped after batch 6; the next start goes on from there"]


def test_a_batch_still_running_at_the_bound_is_cancelled_and_waited_for(caplog):
    """Cancelled, the batch ends with its tasks and the query with it; only then the stop."""
    query, batch_commit = Query(busy_polls=10**6), BatchCommit()
    events = []

    def cancel() -> None:
        events.append("cancelled")
        threading.Timer(0.3, lambda: setattr(query, "isActive", False)).start()

    query.stop = lambda: events.append(f"stopped, active={query.isActive}")

    with caplog.at_level(logging.INFO, logger="retrylib.job"):
        assert stop_gracefully(query, batch_commit, timeout=0.2, cancel_batch=cancel)

    assert events == ["cancelled", "stopped, active=False"]
    assert caplog.messages[0].endswith("runs again at the next start, committing nothing twice")


def test_a_batch_that_finished_is_not_cancelled():
    query, batch_commit = Query(busy_polls=0), BatchCommit()
    cancelled = []

    assert not stop_gracefully(query, batch_commit, timeout=30, cancel_batch=cancelled.append)
    assert query.stopped and cancelled == []


def test_a_trigger_begun_after_the_batch_that_the_stop_fails_is_the_stops_doing(caplog):
    """Past the batch Spark begins the next trigger; interrupted, it may end the query with an
    error Spark does not take for its own interruption. The stop says it cut in (the job
    exits 0, and the trigger's batch runs again at the next start)."""
    query, batch_commit = Query(busy_polls=0), BatchCommit()
    query.error_when_stopped = RuntimeError("java.io.IOException: java.lang.InterruptedException")

    with caplog.at_level(logging.INFO, logger="retrylib.job"):
        assert stop_gracefully(query, batch_commit, timeout=30)

    assert caplog.messages == ["stopped after batch 6; the next start goes on from there"]


def test_a_query_that_failed_before_the_stop_is_not_the_stops_doing():
    query, batch_commit = Query(busy_polls=0), BatchCommit()
    query.isActive = False
    query.error = RuntimeError("the table is gone")

    assert not stop_gracefully(query, batch_commit, timeout=30)
