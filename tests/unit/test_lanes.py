"""Virtual partitions (`lanes`): calls spread over threads by key, each key's records one at
a time in order, outcomes in the records' order, and the timeout kept without SIGALRM."""

from __future__ import annotations

import threading
import time
from collections import Counter

import pytest

from retrylib.handler import HandlerTimeout
from retrylib.record import Record
from retrylib.task.lanes import Lanes, lane_of
from retrylib.task.results import OUTGOING_KIND
from retrylib.task.watchdog import GRACE_S


def records(keys: list[bytes | None]) -> list[Record]:
    return [Record(key, b"v", [], "orders", 0, offset, 0) for offset, key in enumerate(keys)]


class Recorder:
    """A handler that sleeps `pause` s per call and notes the calls, per key, and how many
    ran at once."""

    def __init__(self, pause: float = 0.0, failing: bytes | None = None) -> None:
        self.pause = pause
        self.failing = failing
        self.lock = threading.Lock()
        self.active = 0
        self.most_active = 0
        self.offsets: dict[bytes | None, list[int]] = {}
        self.running: set[bytes] = set()
        self.overlaps = 0  # calls that began while another of their key was running

    def __call__(self, record: Record) -> dict:
        with self.lock:
            self.active += 1
            self.most_active = max(self.most_active, self.active)
            self.overlaps += record.key in self.running
            if record.key is not None:
                self.running.add(record.key)
            self.offsets.setdefault(record.key, []).append(record.offset)
        time.sleep(self.pause)
        with self.lock:
            self.active -= 1
            self.running.discard(record.key)
        if record.key == self.failing:
            raise ValueError(f"bad {record.offset}")
        return {"offset": record.offset}


def test_a_key_always_has_the_same_lane_and_keyless_records_spread_by_offset() -> None:
    assert lane_of(b"customer-7", 1, 8) == lane_of(b"customer-7", 99, 8)
    assert {lane_of(None, offset, 4) for offset in range(8)} == {0, 1, 2, 3}


def test_calls_run_at_once_on_the_lanes_and_each_key_in_offset_order() -> None:
    keys = [f"k{i % 10}".encode() for i in range(60)]
    handler = Recorder(pause=0.02)
    lanes = Lanes(8, handler, timeout_ms=None)

    calls = lanes.call_all(records(keys))
    lanes.close()

    assert [call.result for call in calls] == [{"offset": offset} for offset in range(60)]
    assert 1 < handler.most_active <= 8
    assert handler.overlaps == 0
    for key, offsets in handler.offsets.items():
        assert offsets == sorted(offsets), key
        assert len(offsets) == 6


def test_failures_stay_with_their_records() -> None:
    handler = Recorder(failing=b"bad")
    lanes = Lanes(4, handler, timeout_ms=None)

    calls = lanes.call_all(records([b"ok", b"bad", b"ok", None, b"bad"]))
    lanes.close()

    assert [type(call.error).__name__ if call.error else "ok" for call in calls] == [
        "ok",
        "ValueError",
        "ok",
        "ok",
        "ValueError",
    ]
    assert str(calls[4].error) == "bad 4"


def test_a_call_over_the_timeout_fails_its_lane_goes_on_and_the_call_is_interrupted() -> None:
    interrupted = threading.Event()

    def handler(record: Record) -> dict:
        if record.offset == 0:  # the late call: retries its service under `except Exception`
            try:
                while True:
                    try:
                        time.sleep(0.01)
                    except Exception:
                        pass
            except HandlerTimeout:
                interrupted.set()
                raise
        return {"offset": record.offset}

    counters: Counter[str] = Counter()
    lanes = Lanes(2, handler, timeout_ms=200, counters=counters)
    started = time.monotonic()
    calls = lanes.call_all(records([b"same", b"same", b"other"]))
    took = time.monotonic() - started
    lanes.close()

    assert isinstance(calls[0].error, HandlerTimeout)
    assert str(calls[0].error) == "handler did not return within 0.2s"
    assert [call.result for call in calls[1:]] == [{"offset": 1}, {"offset": 2}]
    assert interrupted.is_set()
    assert took < 1.5  # the limit, and the interrupt's landing: not the grace
    assert counters == {"calls_timed_out": 1}


def test_a_late_call_that_does_not_stop_holds_the_calls_until_its_grace_has_passed() -> None:
    """Without a watchdog (which would end this process: test_call_bounds.py), the calls
    end once the grace has passed; their outcomes are kept."""
    release = threading.Event()

    def handler(record: Record) -> dict:
        if record.offset == 0:
            release.wait(30)  # in C code: the interrupt lands only once it returns
        return {"offset": record.offset}

    lanes = Lanes(2, handler, timeout_ms=200, watchdog=None)
    started = time.monotonic()
    calls = lanes.call_all(records([b"same", b"other"]))
    took = time.monotonic() - started
    release.set()
    lanes.close()

    assert isinstance(calls[0].error, HandlerTimeout)
    assert calls[1].result == {"offset": 1}
    assert 0.2 + GRACE_S <= took < 0.2 + GRACE_S + 1.5


@pytest.mark.parametrize("raised", [KeyboardInterrupt(), SystemExit(3)])
def test_a_base_exception_fails_its_record_only(raised: BaseException) -> None:
    def handler(record: Record) -> dict:
        if record.offset == 1:
            raise raised
        return {}

    lanes = Lanes(2, handler, timeout_ms=None)
    calls = lanes.call_all(records([b"a", b"b", b"c"]))
    lanes.close()

    assert type(calls[1].error).__name__ == "HandlerRaisedBaseException"
    assert calls[0].error is None and calls[2].error is None


MIXED = ["ok-1", "fail-1", "stop-1", "skip-1", "none-1", "wrongtype-1", "ok-2", "fail-2"]


def test_a_task_on_lanes_decides_what_it_decides_on_one(plan) -> None:
    from dataclasses import replace

    from helpers import route

    rows = [{"key": key.encode(), "offset": offset} for offset, key in enumerate(MIXED * 5)]
    one_counters, one = route(plan, rows)
    lanes_counters, on_lanes = route(replace(plan, handler_parallelism=4), rows)

    for counters in (one_counters, lanes_counters):
        counters.pop("handler_ms")
    assert lanes_counters == one_counters
    assert on_lanes["output"] == one["output"]

    def where(outgoing: dict) -> tuple:  # failure times differ from run to run
        return outgoing["topic"], outgoing["partition"], outgoing["key"], outgoing["value"]

    assert list(map(where, on_lanes[OUTGOING_KIND])) == list(map(where, one[OUTGOING_KIND]))
    assert [r["id"] for r in on_lanes["dead_letter"]] == [r["id"] for r in one["dead_letter"]]


def test_handler_parallelism_is_read_and_checked(tmp_path) -> None:
    from helpers import problem_for, write_literal_config

    from retrylib.config.loader import load_config

    assert load_config(write_literal_config(tmp_path)).handler.parallelism == 1
    config = load_config(write_literal_config(tmp_path, {"handler.parallelism": "8"}))
    assert config.handler.parallelism == 8
    assert problem_for(tmp_path, {"handler.parallelism": "0"}).startswith(
        "handler.parallelism: expected a whole number >= 1, got 0"
    )
    vectorised = {"handler.parallelism": "4", "handler.kind": '"arrow"'}
    assert problem_for(tmp_path, vectorised) == (
        "handler.parallelism: spreads calls for one record at a time over lanes, but "
        'handler.kind = "arrow" hands the handler whole batches; remove it, or use a record '
        "handler"
    )
