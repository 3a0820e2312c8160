"""The record a handler receives."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Record:
    """One Kafka record as the handler sees it.

    For a retried record, `topic`, `partition`, `offset` and `timestamp` are those of the
    original record on the main topic, and `attempt` counts earlier handler calls (0 on the
    first delivery). `headers` are the original headers, without retrylib's own.
    `timestamp` is epoch milliseconds.
    """

    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes | None]]
    topic: str
    partition: int
    offset: int
    timestamp: int
    attempt: int = 0
