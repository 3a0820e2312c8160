"""Handlers of the failure-storm test: the service every record needs is down."""

from __future__ import annotations

from retrylib import Record


def service_down(record: Record) -> dict:
    """Fails every record, on every attempt, as a call to a service that refuses
    connections would."""
    raise ConnectionError(f"connection refused (record {record.partition}@{record.offset})")
