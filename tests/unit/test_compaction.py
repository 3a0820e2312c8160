"""The compaction schedule (`[output] optimize_every`): when it is due, and its clock in the
checkpoint. Delta's OPTIMIZE itself is replaced by a recorder; the integration test
`test_scheduled_compaction` runs the real one."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from retrylib.config.table_ref import TableRef
from retrylib.sinks import compaction
from retrylib.sinks.compaction import Compactor, compaction_due

STATE_FILE = "compaction.json"
MINUTE = 60_000
TABLES = [("output", TableRef("/t/out", True)), ("dead-letter", TableRef("/t/dlq", True))]


@pytest.mark.parametrize(
    ("last_ms", "now_ms", "due"),
    [
        (None, 10 * MINUTE, False),  # no clock yet: it starts now
        (0, 30 * MINUTE - 1, False),
        (0, 30 * MINUTE, True),
        (0, 90 * MINUTE, True),
        (60 * MINUTE, 59 * MINUTE, True),  # the clock was set back
        (60 * MINUTE, 60 * MINUTE, False),
    ],
)
def test_compaction_is_due_a_period_after_the_last(last_ms, now_ms, due) -> None:
    assert compaction_due(last_ms, now_ms, 30 * MINUTE) is due


@pytest.fixture
def compacted(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The tables `Compactor` compacts, in order, instead of running OPTIMIZE."""
    calls: list[str] = []

    def fake(spark, table: TableRef) -> tuple[int, int]:
        calls.append(table.text)
        return 10, 1

    monkeypatch.setattr(compaction, "compact", fake)
    return calls


def test_the_first_batch_starts_the_clock_and_a_period_later_all_tables_compact(
    tmp_path: Path, compacted: list[str]
) -> None:
    compactor = Compactor(str(tmp_path / STATE_FILE), 30 * MINUTE, TABLES)

    assert compactor.after_batch(None, now_ms=100 * MINUTE) is False
    assert compactor.after_batch(None, now_ms=129 * MINUTE) is False
    assert compacted == []
    assert compactor.after_batch(None, now_ms=130 * MINUTE) is True
    assert compacted == ["/t/out", "/t/dlq"]
    assert compactor.after_batch(None, now_ms=131 * MINUTE) is False
    assert json.loads((tmp_path / STATE_FILE).read_text()) == {"last_ms": 130 * MINUTE}


def test_a_restart_keeps_the_clock(tmp_path: Path, compacted: list[str]) -> None:
    first = Compactor(str(tmp_path / STATE_FILE), 30 * MINUTE, TABLES)
    first.after_batch(None, now_ms=100 * MINUTE)

    restarted = Compactor(str(tmp_path / STATE_FILE), 30 * MINUTE, TABLES)
    assert restarted.after_batch(None, now_ms=129 * MINUTE) is False
    assert restarted.after_batch(None, now_ms=130 * MINUTE) is True
    assert compacted == ["/t/out", "/t/dlq"]


def test_a_failing_table_is_logged_and_the_others_still_compact(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    calls: list[str] = []

    def fake(spark, table: TableRef) -> tuple[int, int]:
        calls.append(table.text)
        if table.text == "/t/out":
            raise RuntimeError("ConcurrentModificationException")
        return 3, 1

    monkeypatch.setattr(compaction, "compact", fake)
    compactor = Compactor(str(tmp_path / STATE_FILE), 30 * MINUTE, TABLES)
    compactor.after_batch(None, now_ms=0)

    with caplog.at_level(logging.WARNING, logger="retrylib.sinks.compaction"):
        assert compactor.after_batch(None, now_ms=30 * MINUTE) is True

    assert calls == ["/t/out", "/t/dlq"]
    assert "compacting the output table /t/out failed (tried again in 30m" in caplog.text
    assert "ConcurrentModificationException" in caplog.text
    # The attempt counts: the next one is a period later, not at every batch.
    assert compactor.after_batch(None, now_ms=31 * MINUTE) is False


def test_an_unwritable_clock_never_fails_the_batch(
    tmp_path: Path, compacted: list[str], caplog: pytest.LogCaptureFixture
) -> None:
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    compactor = Compactor(str(blocker / STATE_FILE), 30 * MINUTE, TABLES)

    with caplog.at_level(logging.WARNING, logger="retrylib.sinks.compaction"):
        assert compactor.after_batch(None, now_ms=0) is False

    assert "scheduled compaction not done" in caplog.text


def test_an_unreadable_clock_starts_again(
    tmp_path: Path, compacted: list[str], caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / STATE_FILE).write_text('{"last_')  # a write cut short
    compactor = Compactor(str(tmp_path / STATE_FILE), 30 * MINUTE, TABLES)

    with caplog.at_level(logging.WARNING, logger="retrylib.sinks.compaction"):
        assert compactor.after_batch(None, now_ms=100 * MINUTE) is False

    assert "the compaction clock starts now" in caplog.text
    assert json.loads((tmp_path / STATE_FILE).read_text()) == {"last_ms": 100 * MINUTE}
