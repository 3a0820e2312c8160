"""Lifecycle hooks: told of every handler call, retry and dead letter, and unable to change
or fail what the job decides; their config checked at load."""

from __future__ import annotations

import dataclasses
import threading
from collections import Counter
from pathlib import Path

import pytest
import unit_handlers
from helpers import REPO, problem_for, route, write_literal_config

from retrylib.batch.driver_hooks import DriverHooks
from retrylib.config.loader import load_config
from retrylib.task.call_bounds import TimedCall
from retrylib.task.hooks import Hooks

ROWS = [
    {"key": b"ok-1", "offset": 1},
    {"key": b"fail-1", "offset": 2},
    {"key": b"stop-1", "offset": 3},
    {"key": b"skip-1", "offset": 4},
]
RECORD_HOOKS = {
    "before_record": "unit_handlers:before",
    "after_record": "unit_handlers:after",
    "on_retry": "unit_handlers:retried",
    "on_dead_letter": "unit_handlers:dead",
}


@pytest.fixture(autouse=True)
def events():
    unit_handlers.EVENTS.clear()
    yield unit_handlers.EVENTS
    unit_handlers.EVENTS.clear()


def test_record_hooks_are_told_of_each_call_retry_and_dead_letter(plan, events) -> None:
    counters, _ = route(dataclasses.replace(plan, hooks=RECORD_HOOKS), ROWS)
    assert events == [
        ("before", b"ok-1"),
        ("after", b"ok-1", None),
        ("before", b"fail-1"),
        ("after", b"fail-1", "RuntimeError"),
        ("retry", b"fail-1", 1, "RuntimeError"),
        ("before", b"stop-1"),
        ("after", b"stop-1", "NonRetryable"),
        ("dead", b"stop-1", "non_retryable"),
        ("before", b"skip-1"),
        ("after", b"skip-1", "Skip"),
    ]
    assert "hook_errors" not in counters


def test_hooks_that_raise_are_counted_and_change_no_outcome(plan, caplog) -> None:
    unhooked = route(plan, ROWS)
    broken = dict.fromkeys(RECORD_HOOKS, "unit_handlers:broken")
    with caplog.at_level("WARNING", logger="retrylib.task.hooks"):
        counters, written = route(dataclasses.replace(plan, hooks=broken), ROWS)
    assert counters.pop("hook_errors") == 4 + 4 + 1 + 1  # before, after, retry, dead letter
    assert counters.keys() == unhooked[0].keys()
    assert {kind: len(rows) for kind, rows in written.items()} == {
        kind: len(rows) for kind, rows in unhooked[1].items()
    }
    warnings = [r.getMessage() for r in caplog.records if r.name == "retrylib.task.hooks"]
    assert len(warnings) == 4  # the first failure of each hook
    assert warnings[0].startswith(
        "hook before_record (unit_handlers:broken) raised SystemExit: a hook that raises"
    )


def test_batch_hooks_failures_are_counted_for_the_caller(plan) -> None:
    errors: Counter[str] = Counter()
    hooks = Hooks({"on_batch_end": "unit_handlers:broken"}, plan.handler_paths, errors)
    hooks.call("on_batch_start", 3)  # not set: nothing happens
    hooks.call("on_batch_end", 3, {})
    assert errors == {"hook_errors": 1}


def test_a_record_hook_that_hangs_is_stopped_at_the_handler_timeout(plan, caplog) -> None:
    unit_handlers.RELEASE.clear()
    errors: Counter[str] = Counter()
    hooks = Hooks(
        {"before_record": "unit_handlers:stuck"}, plan.handler_paths, errors, TimedCall(100)
    )
    try:
        with caplog.at_level("WARNING", logger="retrylib.task.hooks"):
            hooks.call("before_record", object())  # returns after the bound
    finally:
        unit_handlers.RELEASE.set()
    assert errors == {"hook_errors": 1}
    [warning] = [r.getMessage() for r in caplog.records if r.name == "retrylib.task.hooks"]
    assert warning.startswith(
        "hook before_record (unit_handlers:stuck) raised HandlerTimeout: hook before_record "
        "did not return within 0.1s"
    )


def test_a_batch_hook_that_hangs_is_left_running_and_counted(plan, events, caplog) -> None:
    unit_handlers.RELEASE.clear()
    errors: Counter[str] = Counter()
    hooks = DriverHooks(
        {"on_batch_end": "unit_handlers:stuck"}, plan.handler_paths, errors, timeout_s=0.05
    )
    try:
        with caplog.at_level("WARNING", logger="retrylib.task.hooks"):
            hooks.call("on_batch_end", 1, {})  # returns after the bound
            hooks.call("on_batch_end", 2, {})  # the first still runs: not called
        assert events == [("stuck", 1, {})]
        assert errors == {"hook_errors": 2}
        [warning] = [r.getMessage() for r in caplog.records if r.name == "retrylib.task.hooks"]
        assert warning.startswith(
            "hook on_batch_end (unit_handlers:stuck) has not returned within hooks.timeout "
            "(0.05s); it was interrupted"
        )
    finally:
        unit_handlers.RELEASE.set()
    for thread in threading.enumerate():
        if thread.name == "retrylib hook on_batch_end":
            thread.join(5)
    hooks.call("on_batch_end", 3, {})  # returned: called again
    assert events[-1] == ("stuck", 3, {})


def test_hooks_config_reads_every_hook(tmp_path) -> None:
    paths = f'["{REPO}", "{Path(unit_handlers.__file__).parent}"]'
    extra = "[hooks]\n" + "".join(
        f'{name} = "{reference}"\n'
        for name, reference in {**RECORD_HOOKS, "on_batch_end": "unit_handlers:broken"}.items()
    )
    config = load_config(write_literal_config(tmp_path, {"handler.paths": paths}, extra))
    assert config.hooks.on_retry == "unit_handlers:retried"
    assert config.hooks.on_batch_start is None
    assert config.hooks.timeout_ms == 30_000
    assert config.hooks.references(("on_batch_start", "on_batch_end")) == {
        "on_batch_end": "unit_handlers:broken"
    }


@pytest.mark.parametrize(
    ("extra", "changes", "problem"),
    [
        (
            '[hooks]\nbefore_record = "nosuchmodule:f"\n',
            {},
            "hooks.before_record: cannot import",
        ),
        (
            '[hooks]\non_retry = "retry"\n',
            {},
            'hooks.on_retry: expected a reference like "package.module:function"',
        ),
        (
            '[hooks]\nafter_record = "unit_handlers:after"\n',
            {"handler.kind": '"arrow"'},
            "hooks.after_record: is called around each handler call for one record, but "
            'handler.kind = "arrow" hands the handler whole batches',
        ),
        ('[hooks]\non_start = "unit_handlers:after"\n', {}, "hooks.on_start: unknown key"),
        ('[hooks]\ntimeout = "0s"\n', {}, "hooks.timeout: expected a duration above zero"),
    ],
)
def test_bad_hooks_config_names_the_key(tmp_path, extra, changes, problem) -> None:
    assert problem_for(tmp_path, changes, extra).startswith(problem)
