"""Calling the user's handler: timeouts, BaseExceptions, and checking what it returned."""

from __future__ import annotations

import re
import signal
import threading
import time

import pytest

import retrylib.task.handler as handler_module
from retrylib.handler import BadHandlerResult, HandlerRaisedBaseException, HandlerTimeout
from retrylib.record import Record
from retrylib.task.handler import (
    TimedCall,
    as_failure,
    bound_call,
    call_handler,
    call_isolated,
    load_handler,
    result_rows,
)

COLUMNS = frozenset({"key", "total"})


def record(attempt: int = 0) -> Record:
    return Record(b"k", b"v", [], "orders", 0, 7, 1_700_000_000_000, attempt)


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


def test_a_handler_that_swallows_the_timeout_is_interrupted_again():
    def stubborn(r):
        try:
            time.sleep(30)
        except Exception:
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


def test_a_long_call_is_named_with_its_record_once_it_has_run_half_its_limit(caplog):
    with pytest.raises(HandlerTimeout):
        TimedCall(400)(lambda r: time.sleep(30), record())
    warnings = [r.getMessage() for r in caplog.records if r.name == "retrylib.task.handler"]
    assert len(warnings) == 1, warnings
    assert re.fullmatch(
        r"handler has run 0\.\ds on orders\[0\]@7 and goes on \(handler.timeout 0.4s\)",
        warnings[0],
    )


def test_the_watcher_thread_ends_once_no_call_comes(monkeypatch):
    monkeypatch.setattr(handler_module, "_IDLE_SECONDS", 0.1)
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
        call_isolated(timed, lambda r: time.sleep(30), record())


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


# -- call_handler -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raised", "message"),
    [
        (SystemExit(3), "handler raised SystemExit: 3"),
        (SystemExit(), "handler raised SystemExit"),
        (KeyboardInterrupt(), "handler raised KeyboardInterrupt"),
        (GeneratorExit("closing"), "handler raised GeneratorExit: closing"),
    ],
)
def test_base_exceptions_become_ordinary_failures(raised, message):
    def handler(r):
        raise raised

    with pytest.raises(HandlerRaisedBaseException) as info:
        call_handler(TimedCall(None), handler, record())
    assert str(info.value) == message
    assert info.value.__cause__ is raised
    assert isinstance(info.value, Exception)


def test_a_custom_base_exception_with_an_unprintable_message():
    class Weird(BaseException):
        def __str__(self):
            raise RuntimeError("no")

    def handler(r):
        raise Weird

    with pytest.raises(HandlerRaisedBaseException, match="handler raised Weird: <unprintable>"):
        call_handler(TimedCall(None), handler, record())


def test_exceptions_are_raised_unchanged():
    error = ValueError("bad")

    def handler(r):
        raise error

    with pytest.raises(ValueError) as info:
        call_handler(TimedCall(None), handler, record())
    assert info.value is error


def test_call_handler_applies_the_timeout():
    with pytest.raises(HandlerTimeout):
        call_handler(TimedCall(100), lambda r: time.sleep(10), record())


# -- bound_call and as_failure: the per-record path of the batch task ---------------------


def test_bound_call_is_the_function_itself_without_a_timeout():
    def handler(r):
        return {"offset": r.offset}

    assert bound_call(handler, TimedCall(None)) is handler


def test_bound_call_applies_the_timeout():
    invoke = bound_call(lambda r: time.sleep(10), TimedCall(100))
    with pytest.raises(HandlerTimeout):
        invoke(record())


def test_as_failure_keeps_exceptions_and_wraps_other_base_exceptions():
    error = ValueError("bad")
    assert as_failure(error) is error
    stop = SystemExit(3)
    failure = as_failure(stop)
    assert isinstance(failure, HandlerRaisedBaseException)
    assert str(failure) == "handler raised SystemExit: 3"
    assert failure.__cause__ is stop


# -- result_rows --------------------------------------------------------------------------


def test_results_become_lists_of_rows():
    assert result_rows(None, COLUMNS) == []
    assert result_rows({"key": "a"}, COLUMNS) == [{"key": "a"}]
    assert result_rows([{"key": "a"}, {"total": 1}], COLUMNS) == [{"key": "a"}, {"total": 1}]
    assert result_rows([], COLUMNS) == []


@pytest.mark.parametrize(
    ("result", "message"),
    [
        ("a string", "handler returned str; return a dict, a list of dicts or None"),
        (("a", "tuple"), "handler returned tuple; return a dict, a list of dicts or None"),
        (42, "handler returned int; return a dict, a list of dicts or None"),
        ([{"key": "a"}, "b"], "handler returned a list holding str"),
        ({"key": "a", "nope": 1}, "column(s) ['nope'] not in the output schema ['key', 'total']"),
        ([{"zz": 1, "aa": 2}], "column(s) ['aa', 'zz'] not in the output schema"),
    ],
)
def test_bad_results_are_named(result, message):
    with pytest.raises(BadHandlerResult) as info:
        result_rows(result, COLUMNS)
    assert message in str(info.value)


# -- load_handler -------------------------------------------------------------------------


def test_load_handler_imports_once_and_checks_callable(tmp_path):
    (tmp_path / "unit_handler_mod.py").write_text(
        "calls = 0\ndef h(r):\n    return None\nnot_fn = 3\n"
    )
    first = load_handler("unit_handler_mod:h", [str(tmp_path)])
    assert load_handler("unit_handler_mod:h", [str(tmp_path)]) is first
    with pytest.raises(TypeError, match="is not callable"):
        load_handler("unit_handler_mod:not_fn", [str(tmp_path)])
    with pytest.raises(ImportError):
        load_handler("no_such_module_here:h", [str(tmp_path)])
