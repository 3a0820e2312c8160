"""Log lines go to the stderr of the moment, so a closed capture never breaks logging."""

from __future__ import annotations

import io
import logging
import sys

import pytest

from retrylib.logs import KAFKA_CLIENT_LOGGER, OnceAMinute, configure_logging


def test_logging_after_a_swapped_stderr_is_closed(monkeypatch: pytest.MonkeyPatch) -> None:
    capture = io.StringIO()
    monkeypatch.setattr(sys, "stderr", capture)
    configure_logging("INFO", "text")
    logging.getLogger("retrylib.test").info("first")
    assert "retrylib.test: first" in capture.getvalue()
    later = io.StringIO()
    monkeypatch.setattr(sys, "stderr", later)
    capture.close()

    logging.getLogger("retrylib.test").info("second")  # no "I/O operation on closed file"

    assert "retrylib.test: second" in later.getvalue()


def test_librdkafka_fencing_lines_are_debug_and_its_other_warnings_stay(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    capture = io.StringIO()
    monkeypatch.setattr(sys, "stderr", capture)
    configure_logging("INFO", "text")
    kafka = logging.getLogger(KAFKA_CLIENT_LOGGER)
    kafka.setLevel(logging.WARNING)  # as in a Python worker
    kafka.critical(
        "FATAL [rdkafka#producer-1] [thrd:main]: Fatal error: Local: This instance has been "
        "fenced by a newer instance: Failed to add partitions to transaction"
    )
    kafka.error(
        'ADDPARTS [rdkafka#producer-1]: Failed to add partition "t" [0] to transaction: '
        "Broker: Producer attempted an operation with an old epoch"
    )
    kafka.warning("FAIL [rdkafka#consumer-2]: Connect to ipv4#127.0.0.1:9 failed")

    assert capture.getvalue().count("\n") == 1
    assert "WARNING retrylib.kafka.librdkafka: FAIL" in capture.getvalue()

    configure_logging("DEBUG", "text")
    kafka.critical("TXNERR [rdkafka#producer-1]: This instance has been fenced by a newer instance")

    assert "DEBUG retrylib.kafka.librdkafka: TXNERR" in capture.getvalue()


def test_a_kind_of_librdkafka_line_is_shown_once_a_minute_with_a_count_of_the_rest() -> None:
    now = [0.0]
    limit = OnceAMinute(every_s=60, clock=lambda: now[0])
    kafka = logging.getLogger(f"{KAFKA_CLIENT_LOGGER}.limited")
    kafka.setLevel(logging.WARNING)

    def shown(fac: str, level: int = logging.ERROR) -> str | None:
        record = kafka.makeRecord(kafka.name, level, "f", 1, "%s [%s] %s", (fac, "c#1", "x"), None)
        return record.getMessage() if limit.filter(record) else None

    assert shown("FAIL") == "FAIL [c#1] x"
    assert [shown("FAIL") for _ in range(20)] == [None] * 20
    assert shown("ERROR") == "ERROR [c#1] x"  # another kind
    assert shown("FAIL", logging.WARNING) == "FAIL [c#1] x"  # another level
    now[0] = 61.0
    assert shown("FAIL") == "FAIL [c#1] x (20 more like it held back since the last)"
    assert shown("FAIL") is None
    kafka.setLevel(logging.DEBUG)
    assert shown("FAIL") == "FAIL [c#1] x"  # DEBUG shows every line
