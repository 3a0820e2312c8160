"""The dead-letter table: one row per record that ran out of attempts or could not be retried."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pyarrow as pa

HEADERS_TYPE = pa.list_(pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())]))
_TIMESTAMP = pa.timestamp("us", tz="UTC")

DEAD_LETTER_SCHEMA = pa.schema(
    [
        pa.field("id", pa.string(), nullable=False),
        pa.field("job", pa.string()),
        pa.field("origin_topic", pa.string()),
        pa.field("origin_partition", pa.int32()),
        pa.field("origin_offset", pa.int64()),
        pa.field("origin_timestamp", _TIMESTAMP),
        pa.field("source_topic", pa.string()),
        pa.field("attempts", pa.int32()),
        pa.field("reason", pa.string()),
        pa.field("error_class", pa.string()),
        pa.field("error_message", pa.string()),
        pa.field("stack_trace", pa.string()),
        pa.field("first_failure", _TIMESTAMP),
        pa.field("last_failure", _TIMESTAMP),
        pa.field("dead_lettered_at", _TIMESTAMP),
        pa.field("batch_id", pa.int64()),
        pa.field("key", pa.binary()),
        pa.field("value", pa.binary()),
        pa.field("headers", HEADERS_TYPE),
        pa.field("redrive_id", pa.string()),
        pa.field("redrive_topic", pa.string()),
        pa.field("redriven_at", _TIMESTAMP),
    ]
)
"""Columns of the dead-letter Delta table. Times are UTC; `headers` are the record's own
headers without retrylib's; `attempts` counts handler calls made (0 when never handled,
e.g. an unverified retry record); `reason` is one of those listed for
`retrylib.dead_letter.reason` in docs/retries.md; `source_topic` is the topic the failing copy was
read from.

The last three are null until `retrylib redrive` sends the record back: `redrive_id` and
`redrive_topic` are set when a redrive claims the row, `redriven_at` once the record is
committed to `redrive_topic` (see `retrylib.ops.redrive`)."""


def dead_letter_struct():
    """`DEAD_LETTER_SCHEMA` as a Spark StructType."""
    from pyspark.sql.pandas.types import from_arrow_schema

    return from_arrow_schema(DEAD_LETTER_SCHEMA)


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """One dead-lettered record, as written to the table (times in epoch ms)."""

    id: str
    origin_topic: str
    origin_partition: int
    origin_offset: int
    origin_timestamp_ms: int
    source_topic: str
    attempts: int
    reason: str
    error_class: str
    error_message: str
    stack_trace: str
    first_failure_ms: int
    last_failure_ms: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes | None]]

    def row(self, job: str, batch_id: int, now_ms: int) -> dict[str, Any]:
        return {
            "id": self.id,
            "job": job,
            "origin_topic": self.origin_topic,
            "origin_partition": self.origin_partition,
            "origin_offset": self.origin_offset,
            "origin_timestamp": self.origin_timestamp_ms * 1000,
            "source_topic": self.source_topic,
            "attempts": self.attempts,
            "reason": self.reason,
            "error_class": self.error_class,
            "error_message": self.error_message,
            "stack_trace": self.stack_trace,
            "first_failure": self.first_failure_ms * 1000,
            "last_failure": self.last_failure_ms * 1000,
            "dead_lettered_at": now_ms * 1000,
            "batch_id": batch_id,
            "key": self.key,
            "value": self.value,
            "headers": [{"key": k, "value": v} for k, v in self.headers],
        }
