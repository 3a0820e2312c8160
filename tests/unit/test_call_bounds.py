"""How long a user call may run on an executor: the limit, its interrupts, and the watchdog
that ends a process whose call does not stop (`task.call_bounds`, `task.watchdog`)."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections import Counter

import pytest

import retrylib.task.call_bounds as MODULE
from retrylib.handler import HandlerTimeout
from retrylib.record import Record
from retrylib.task.call_bounds import TimedCall, bound_call, call_isolated
from retrylib.task.watchdog import GRACE_S


def record(attempt: int = 0) -> Record:
    return Record(b"k", b"v", [], "orders", 0, 7, 1_700_000_000_000, attempt)


def catches_everything(r: Record) -> None:
    while True:
        try:
            time.sleep(0.05)
        except BaseException:
            pass


@pytest.fixture(autouse=True)
def no_alarm_left():
    previous = signal.getsignal(signal.SIGALRM)
    yield
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0), "an alarm was left armed"
    signal.signal(signal.SIGALRM, previous)


# -- TimedCall ----------------------------------------------------------------------------


def test_a_call_within_the_timeout_returns_its_result():
    assert TimedCall(2_000)(lambda r: {"key": r.key.decode()}, record()) == {"key": "k"}


def test_a_hanging_call_raises_handler_timeout_after_the_timeout():
    started = time.monotonic()
    with pytest.raises(HandlerTimeout, match=r"did not return within 0\.2s"):
        TimedCall(200)(lambda r: time.sleep(30), record())
    assert 0.15 < time.monotonic() - started < 2


def test_a_handler_that_retries_under_except_exception_is_stopped():
    """The most common handler shape of all: catch everything, wait, try again."""

    def retries_for_ever(r):
        while True:
            try:
                raise ConnectionError("the service is down")
            except Exception:
                time.sleep(0.05)

    counters: Counter[str] = Counter()
    started = time.monotonic()
    with pytest.raises(HandlerTimeout, match=r"did not return within 0\.2s"):
        TimedCall(200, counters)(retries_for_ever, record())
    assert time.monotonic() - started < 1.5
    assert counters == {"calls_timed_out": 1}


def test_a_handler_that_swallows_the_timeout_is_interrupted_again():
    def stubborn(r):
        try:
            time.sleep(30)
        except BaseException:
            time.sleep(30)

    started = time.monotonic()
    with pytest.raises(HandlerTimeout):
        TimedCall(200)(stubborn, record())
    assert time.monotonic() - started < 3  # timeout, then one re-fire a second later


def test_a_swallowed_timeout_with_a_normal_return_counts_as_success():
    def gives_up(r):
        try:
            time.sleep(30)
        except HandlerTimeout:
            return {"key": "late"}

    assert TimedCall(200)(gives_up, record()) == {"key": "late"}


def test_a_late_alarm_after_the_call_is_ignored():
    timed = TimedCall(200)
    assert timed(lambda r: None, record()) is None
    signal.setitimer(signal.ITIMER_REAL, 0.05)  # as if the alarm fired just after the call
    time.sleep(0.2)  # would raise HandlerTimeout here if the alarm were still armed


def test_errors_of_the_handler_pass_through_and_disarm():
    timed = TimedCall(5_000)
    with pytest.raises(ZeroDivisionError):
        timed(lambda r: 1 / 0, record())


def test_a_long_call_is_named_with_its_record_at_half_its_limit_and_at_its_limit(caplog):
    with pytest.raises(HandlerTimeout):
        TimedCall(400)(lambda r: time.sleep(30), record())
    lines = [(r.levelname, r.getMessage()) for r in caplog.records if r.name == MODULE.__name__]
    assert len(lines) == 2, lines
    assert lines[0][0] == "WARNING"
    assert re.fullmatch(
        r"handler has run 0\.\ds on orders\[0\]@7 and goes on \(handler.timeout 0.4s\)",
        lines[0][1],
    )
    assert lines[1] == (
        "ERROR",
        "handler on orders[0]@7 has run past handler.timeout 0.4s: interrupted (HandlerTimeout, "
        "again every 1s while it runs); if it has not stopped 2s later, its Python worker is "
        "ended",
    )


def test_the_watcher_thread_ends_once_no_call_comes(monkeypatch):
    monkeypatch.setattr(MODULE, "_IDLE_SECONDS", 0.1)
    timed = TimedCall(200)
    assert timed(lambda r: "x", record()) == "x"
    watchers = [t for t in threading.enumerate() if t.name == "retrylib-timeout"]
    assert watchers
    for watcher in watchers:
        watcher.join(timeout=2)
    assert not any(t.name == "retrylib-timeout" for t in threading.enumerate())
    with pytest.raises(HandlerTimeout):  # and a later call is watched again
        timed(lambda r: time.sleep(30), record())


def test_a_call_in_a_forked_child_is_bounded_too():
    timed = TimedCall(200)
    assert timed(lambda r: "parent", record()) == "parent"  # the watcher runs in this process
    with pytest.raises(HandlerTimeout, match="within 0.2s"):
        call_isolated(timed, "handler", lambda r: time.sleep(30), record())
    assert timed.counters == {"calls_timed_out": 1}  # counted here: the child's count is lost


def test_a_forked_call_that_does_not_stop_has_its_process_ended(caplog):
    """The batch run after a worker was ended: each call's child is ended at its bound,
    and its record alone fails."""
    timed = TimedCall(200)
    started = time.monotonic()
    with pytest.raises(HandlerTimeout) as info:
        call_isolated(timed, "handler", catches_everything, record())
    took = time.monotonic() - started
    assert str(info.value) == (
        "handler did not return within 0.2s, nor stop when interrupted: its process was ended "
        "2s later"
    )
    assert 0.2 + GRACE_S <= took < 0.2 + GRACE_S + 2
    assert timed.counters == {"calls_timed_out": 1, "call_processes_ended": 1}
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert (
        "handler on orders[0]@7 did not stop within 2s of handler.timeout 0.2s, interrupted: "
        "its process was ended; the record fails with HandlerTimeout"
    ) in errors


def test_no_timeout_calls_directly():
    assert TimedCall(None)(lambda r: "x", record()) == "x"
    assert TimedCall(0)(lambda r: "y", record()) == "y"


def test_off_the_main_thread_calls_run_unlimited(caplog):
    results = []

    def run():
        timed = TimedCall(100)
        results.append((timed.timeout_ms, timed(lambda r: (time.sleep(0.3), "done")[1], record())))

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    assert results == [(None, "done")]
    assert "needs the main thread" in caplog.text


# -- bound_call: the per-record path of the batch task ------------------------------------


def test_bound_call_is_the_function_itself_without_a_timeout():
    def handler(r):
        return {"offset": r.offset}

    assert bound_call(handler, TimedCall(None)) is handler


def test_bound_call_applies_the_timeout():
    invoke = bound_call(lambda r: time.sleep(10), TimedCall(100))
    with pytest.raises(HandlerTimeout):
        invoke(record())


# -- the watchdog: a call that does not stop ends its process ------------------------------

CALLER = textwrap.dedent(
    """
    import logging, re, signal, sys, time
    from retrylib.record import Record
    from retrylib.task.call_bounds import TimedCall
    from retrylib.task.lanes import Lanes

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")

    def catches_everything(r):
        while True:
            try:
                time.sleep(0.05)
            except BaseException:
                pass

    def blocks_the_signal(r):
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
        time.sleep(60)

    def holds_the_gil(r):  # backtracks for ages in C code that never lets go of the GIL
        re.match(r"(a+)+$", "a" * 40 + "b")

    how, shape = sys.argv[1], globals()[sys.argv[2]]
    record = Record(b"k", b"v", [], "orders", 0, 7, 0)
    if how == "timed":
        TimedCall(300)(shape, record)
    else:
        Lanes(2, shape, 300).call_all([record])
    print("the call returned")
    """
)


@pytest.mark.parametrize(
    ("how", "shape"),
    [
        ("timed", "catches_everything"),
        ("timed", "blocks_the_signal"),
        ("timed", "holds_the_gil"),
        ("lane", "catches_everything"),
        ("lane", "holds_the_gil"),
    ],
)
def test_a_call_that_does_not_stop_has_its_process_ended(how, shape):
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", CALLER, how, shape], capture_output=True, text=True, timeout=60
    )
    took = time.monotonic() - started
    assert done.returncode == -signal.SIGKILL, done.stdout + done.stderr
    assert "the call returned" not in done.stdout
    assert 0.3 + GRACE_S <= took < 0.3 + GRACE_S + 5, took
    ended = [line for line in done.stderr.splitlines() if "ending Python worker" in line]
    assert len(ended) == 1, done.stderr
    assert " ERROR retrylib.task.watchdog: ending Python worker " in ended[0]  # logs.py's form
    assert ended[0].endswith(
        ": a call of yours has run 2s past its limit (handler.timeout 0.3s) and did not stop "
        "when interrupted; its task runs again with each call in a process of its own, where "
        "that call fails alone as a HandlerTimeout"
    )
