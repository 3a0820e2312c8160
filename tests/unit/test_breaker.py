"""The circuit breaker (`[breaker]`): when it trips, probes and closes; what the source lets
in while it is open; and the config that turns it on. No Spark, no broker."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from helpers import FakeKafka, problem_for, reader_for, write_literal_config

from retrylib.config.loader import load_config
from retrylib.config.model import BreakerConfig
from retrylib.kafka.offsets import offsets_from_json
from retrylib.retry.breaker import (
    CLOSED,
    OPEN,
    Breaker,
    BreakerState,
    main_topic_allowance,
    read_state,
    write_state,
)

CONFIG = BreakerConfig(failure_share=0.5, window=100, probe_every_ms=30_000, probe_records=5)
P0 = ("orders", 0)
TIER = ("orders.retry", 0)


@pytest.fixture
def breaker(tmp_path) -> Breaker:
    return Breaker(CONFIG, tmp_path / "state.json")


def test_it_trips_only_once_a_whole_window_has_failed_enough(breaker) -> None:
    breaker.after_batch(60, 60, now_ms=1_000)
    assert breaker.state.phase == CLOSED  # 60 records: less than a window

    breaker.after_batch(40, 0, now_ms=2_000)

    assert breaker.state == BreakerState(OPEN, 32_000, 5)
    assert read_state(str(breaker.state_file)) == breaker.state


def test_old_batches_leave_the_window(breaker) -> None:
    breaker.after_batch(100, 90, now_ms=0)  # would trip alone ...
    assert breaker.state.phase == OPEN

    fresh = Breaker(CONFIG, breaker.state_file)
    fresh.after_batch(100, 10, now_ms=0)
    fresh.after_batch(100, 40, now_ms=0)  # ... the window is the last 100: 40% failed
    assert fresh.state.phase == CLOSED


def test_a_passing_probe_closes_it_and_a_failing_one_waits_for_the_next(breaker) -> None:
    breaker.after_batch(100, 100, now_ms=0)
    breaker.after_batch(0, 0, now_ms=40_000)  # a batch of retries only: no probe result
    assert breaker.state == BreakerState(OPEN, 30_000, 5)

    breaker.after_batch(5, 3, now_ms=40_000)
    assert breaker.state == BreakerState(OPEN, 70_000, 5)

    breaker.after_batch(5, 2, now_ms=80_000)
    assert breaker.state.phase == CLOSED
    breaker.after_batch(50, 50, now_ms=90_000)  # the window starts empty again
    assert breaker.state.phase == CLOSED


def test_the_source_holds_main_topics_until_the_probe_is_due() -> None:
    assert main_topic_allowance(BreakerState(CLOSED), now_ms=0) is None
    assert main_topic_allowance(BreakerState(OPEN, 30_000, 5), now_ms=29_999) == 0
    assert main_topic_allowance(BreakerState(OPEN, 30_000, 5), now_ms=30_000) == 5


def test_a_state_file_not_written_yet_reads_as_closed(tmp_path) -> None:
    assert read_state(str(tmp_path / "none.json")) == BreakerState(CLOSED)


def breaker_reader(state_file):
    """A reader of main topic `orders` (50 records) and its tier (8, all due) that reads the
    breaker's state from `state_file`."""
    return reader_for(
        FakeKafka({P0: 50, TIER: 8}, due={TIER: 8}),
        subscribe="orders,orders.retry",
        **{
            "retrylib.topicDelaysMs": '{"orders.retry": 1000}',
            "retrylib.breakerFile": str(state_file),
        },
    )


def test_the_reader_holds_main_partitions_and_lets_tiers_go_on(tmp_path) -> None:
    state_file = tmp_path / "state.json"
    reader = breaker_reader(state_file)
    start = {"orders": {"0": 10}, "orders.retry": {"0": 2}}

    write_state(state_file, BreakerState(OPEN, 2**62, 5))
    assert offsets_from_json(reader.latestOffset(start, None)) == {P0: 10, TIER: 8}

    write_state(state_file, BreakerState(OPEN, 0, 5))
    assert offsets_from_json(reader.latestOffset(start, None)) == {P0: 15, TIER: 8}

    write_state(state_file, BreakerState(CLOSED))
    assert offsets_from_json(reader.latestOffset(start, None)) == {P0: 50, TIER: 8}


def test_config_defaults(tmp_path) -> None:
    path = write_literal_config(tmp_path, {"kafka.source": '"python"'}, extra="[breaker]\n")

    assert load_config(path).breaker == BreakerConfig(0.5, 1000, 30_000, 10)


def test_the_builtin_source_is_refused_with_the_fix(tmp_path) -> None:
    problem = problem_for(tmp_path, {"kafka.source": '"builtin"'}, extra="[breaker]\n")

    assert problem.startswith('breaker: needs kafka.source = "python" (it is "builtin")')
    assert 'set kafka.source = "python" or remove [breaker]' in problem


def test_a_zero_share_is_refused(tmp_path) -> None:
    extra = '[breaker]\nfailure_share = "0%"\n'
    problem = problem_for(tmp_path, {"kafka.source": '"python"'}, extra=extra)

    assert problem.startswith("breaker.failure_share: ")
    assert "give a share above 0%" in problem


def test_a_health_check_that_does_not_import_is_refused_by_its_key(tmp_path) -> None:
    extra = '[breaker]\nhealth = "nosuchmodule:payments_up"\n'
    problem = problem_for(tmp_path, {"kafka.source": '"python"'}, extra=extra)

    assert problem.startswith('breaker.health: cannot import "nosuchmodule:payments_up"')


def test_a_pause_holds_every_partition_and_outlives_the_breaker_s_own_changes(breaker) -> None:
    breaker.health(False, "payments down")
    assert breaker.state == BreakerState(CLOSED, paused=True)
    breaker.after_batch(100, 100, now_ms=0)  # trips while paused: the pause stays
    assert breaker.state == BreakerState(OPEN, 30_000, 5, paused=True)
    breaker.health(True, "payments up")
    assert read_state(str(breaker.state_file)) == BreakerState(OPEN, 30_000, 5)


def test_each_batch_s_paused_ms_is_the_pause_since_the_last_batch(
    breaker, monkeypatch, caplog
) -> None:
    clock = iter([10.0, 12.5, 20.0, 21.0, 30.0]).__next__
    monkeypatch.setattr("retrylib.retry.breaker.time", SimpleNamespace(monotonic=clock))

    breaker.health(False, "payments down")  # at 10
    assert breaker.take_paused_ms() == 2_500  # at 12.5: still paused
    breaker.health(True, "payments up")  # at 20
    assert breaker.take_paused_ms() == 7_500  # at 21
    assert breaker.take_paused_ms() == 0  # at 30
    assert "resumed after 10.0 s paused: payments up" in caplog.text


def test_the_reader_reads_nothing_while_paused(tmp_path) -> None:
    state_file = tmp_path / "state.json"
    reader = breaker_reader(state_file)
    start = {"orders": {"0": 10}, "orders.retry": {"0": 2}}

    write_state(state_file, BreakerState(CLOSED, paused=True))
    assert offsets_from_json(reader.latestOffset(start, None)) == {P0: 10, TIER: 2}


def test_the_health_watch_counts_a_raise_or_a_hang_as_down(breaker) -> None:
    import threading

    from retrylib.batch.health_watch import HealthWatch

    answers = iter(["up", "", "raise", "hang", "up again"])
    release = threading.Event()

    def check() -> str:
        answer = next(answers)
        if answer == "raise":
            raise RuntimeError("no route to payments")
        if answer == "hang":
            release.wait(10)
        return answer

    watch = HealthWatch(check, every_s=3600, timeout_s=0.2, breaker=breaker)  # not started
    assert watch.ask() == (True, "breaker.health says up")
    assert watch.ask() == (False, "breaker.health says down")
    assert watch.ask() == (False, "breaker.health raised RuntimeError: no route to payments")
    assert watch.ask() == (
        False,
        "breaker.health has not returned within breaker.health_timeout (0.2s); it was "
        "interrupted, and is not called again until it returns",
    )
    assert watch.ask() == (
        False,
        "breaker.health is still running from an earlier call; not called this time",
    )
    release.set()
    for thread in threading.enumerate():
        if thread.name == "retrylib breaker.health":
            thread.join(5)
    assert watch.ask() == (True, "breaker.health says up")  # a new call, once that one ended
