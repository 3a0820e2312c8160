"""The driver's steps that run at once (`batch.at_once`); no Spark."""

from __future__ import annotations

import threading
import time

import pytest

from retrylib.batch.at_once import Started, all_at_once


def test_calls_run_at_once_and_their_results_come_in_order() -> None:
    both = threading.Barrier(2, timeout=5)  # each call waits for the other: only at once ends

    def call(value: str) -> str:
        both.wait()
        return value

    assert all_at_once(None, lambda: call("first"), lambda: call("second")) == ["first", "second"]


def test_the_first_failure_in_order_is_raised_once_every_call_has_ended() -> None:
    ended = []

    def slow_failure() -> None:
        time.sleep(0.2)
        ended.append("slow")
        raise KeyError("slow")

    def fast_failure() -> None:
        raise ValueError("fast")

    with pytest.raises(KeyError):
        all_at_once(None, lambda: ended.append("first"), slow_failure, fast_failure)
    assert ended == ["first", "slow"]


def test_a_started_call_gives_its_result_or_raises_its_error_when_asked() -> None:
    assert Started(None, lambda: 42).result() == 42
    failed = Started(None, lambda: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        failed.result()
