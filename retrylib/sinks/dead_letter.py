"""The dead-letter table: one row per record that ran out of attempts or could not be retried."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import pyarrow as pa

from retrylib.kafka.arrow_records import HEADERS_TYPE

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
        """This record's row of `DEAD_LETTER_SCHEMA`, dead-lettered at `now_ms` by batch
        `batch_id` of `job`. Each field is the column of its name, a field `<name>_ms` the
        timestamp column `<name>`; the redrive columns are left out (null).
        """
        row: dict[str, Any] = {"job": job, "batch_id": batch_id, "dead_lettered_at": now_ms * 1000}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name.endswith("_ms"):
                row[f.name.removesuffix("_ms")] = value * 1000
            elif f.name == "headers":
                row["headers"] = [{"key": k, "value": v} for k, v in value]
            else:
                row[f.name] = value
        return row
