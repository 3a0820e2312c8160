"""The record a handler receives."""

from __future__ import annotations

from typing import NamedTuple


class Record(NamedTuple):
    """One Kafka record as the handler sees it: immutable, fields read by name.

    For a retried record, `topic`, `partition`, `offset` and `timestamp` are those of the
    original record on the main topic, and `attempt` counts earlier handler calls (0 on the
    first delivery). `headers` are the original headers, without retrylib's own.
    `timestamp` is epoch milliseconds (-1 when the record has none).

    A named tuple rather than a frozen dataclass: one is built per record, and a tuple is
    built about three times faster.
    """

    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes | None]]
    topic: str
    partition: int
    offset: int
    timestamp: int
    attempt: int = 0
