"""Log lines go to the stderr of the moment, so a closed capture never breaks logging."""

from __future__ import annotations

import io
import logging
import sys

import pytest

from retrylib.logs import configure_logging


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
