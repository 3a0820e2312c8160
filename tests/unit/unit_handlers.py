"""Handlers for the unit tests of the batch task: behaviour by key."""

from __future__ import annotations

from retrylib import NonRetryable, Record


def by_key(record: Record) -> dict | None:
    key = record.key.decode()
    if key.startswith("fail"):
        raise RuntimeError("boom")
    if key.startswith("stop"):
        raise NonRetryable("no")
    if key.startswith("wrongtype"):
        return {"key": key, "attempt": "not a number"}
    if key.startswith("none"):
        return None
    return {"key": key, "topic": record.topic, "offset": record.offset, "attempt": record.attempt}
