"""Lifecycle hooks for the integration tests: each appends what it was told, as a JSON line,
to the file named by $RETRYLIB_TEST_HOOK_LOG (executors and driver alike); `broken` raises,
`hangs` never returns."""

from __future__ import annotations

import json
import os
import threading

from retrylib import Record


def _log(event: str, **fields: object) -> None:
    with open(os.environ["RETRYLIB_TEST_HOOK_LOG"], "a") as log:
        log.write(json.dumps({"event": event, **fields}) + "\n")


def before(record: Record) -> None:
    _log("before", key=record.key.decode(), attempt=record.attempt)


def after(record: Record, error: BaseException | None) -> None:
    _log("after", key=record.key.decode(), error=error and type(error).__name__)


def retried(record: Record, tier: int, error: BaseException) -> None:
    _log("retry", key=record.key.decode(), tier=tier)


def dead(record: Record, reason: str, error: BaseException) -> None:
    _log("dead", key=record.key.decode(), reason=str(reason))


def batch_start(batch_id: int) -> None:
    _log("batch_start", batch_id=batch_id)


def batch_end(batch_id: int, counters: dict) -> None:
    _log("batch_end", batch_id=batch_id, counters=counters)


def broken(*args: object) -> None:
    raise RuntimeError("this hook always fails")


def hangs(*args: object) -> None:
    """A hook that never returns (within any test)."""
    threading.Event().wait()
