"""The vectorised handler form: one call per Arrow batch (or pandas DataFrame) of records.

For `handler.kind = "arrow"` the handler gets a `pyarrow.RecordBatch`, for `"pandas"` a
`pandas.DataFrame`, with the columns of `INPUT_SCHEMA` (for a retried record: the original
topic, partition, offset and timestamp, and its attempt). It returns either

- a RecordBatch, Table or DataFrame with exactly one output row per input row (all
  succeeded), or
- a sequence with one result per input row, each what a record handler returns (a dict,
  a list of dicts, None) or an exception instance (that row failed).

If the call raises, every row of the call failed with that error.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from retrylib.handler import BadHandlerResult
from retrylib.kafka.arrow_records import HEADERS_TYPE
from retrylib.record import Record
from retrylib.retry.headers import RESERVED

INPUT_SCHEMA = pa.schema(
    [
        pa.field("key", pa.binary()),
        pa.field("value", pa.binary()),
        pa.field("headers", HEADERS_TYPE),
        pa.field("topic", pa.string()),
        pa.field("partition", pa.int32()),
        pa.field("offset", pa.int64()),
        pa.field("timestamp", pa.int64()),  # epoch milliseconds
        pa.field("attempt", pa.int32()),
    ]
)


def input_from_kafka(batch: pa.RecordBatch) -> pa.RecordBatch:
    """The handler input for main-topic records, built column-wise from the source batch."""
    millis = pc.divide(batch.column("timestamp").cast(pa.int64()), 1000)
    return pa.RecordBatch.from_arrays(
        [
            batch.column("key"),
            batch.column("value"),
            batch.column("headers").cast(HEADERS_TYPE),
            batch.column("topic"),
            batch.column("partition"),
            batch.column("offset"),
            millis,
            pa.array([0] * batch.num_rows, pa.int32()),
        ],
        schema=INPUT_SCHEMA,
    )


def carries_reserved_headers(batch: pa.RecordBatch) -> bool:
    """True when a record of `batch` (Kafka records) has a header only retrylib may set."""
    names = pc.list_flatten(batch.column("headers")).field("key")
    return bool(len(names)) and pc.any(pc.is_in(names, value_set=_RESERVED_NAMES)).as_py()


_RESERVED_NAMES = pa.array(sorted(RESERVED), pa.string())


def input_from_records(records: Sequence[Record]) -> pa.RecordBatch:
    """The handler input for records already decoded one by one (batches with retries)."""
    return pa.RecordBatch.from_pydict(
        {
            "key": [r.key for r in records],
            "value": [r.value for r in records],
            "headers": [[{"key": k, "value": v} for k, v in r.headers] for r in records],
            "topic": [r.topic for r in records],
            "partition": [r.partition for r in records],
            "offset": [r.offset for r in records],
            "timestamp": [r.timestamp for r in records],
            "attempt": [r.attempt for r in records],
        },
        schema=INPUT_SCHEMA,
    )


def as_output_table(result: Any, rows: int, schema: pa.Schema) -> pa.Table | None:
    """`result` as a Table of `schema` when it is frame-like (one row per input row).

    Returns None when `result` is a per-row sequence instead. Raises `BadHandlerResult`
    when a frame has another row count or does not fit `schema`.
    """
    if isinstance(result, pa.RecordBatch):
        result = pa.Table.from_batches([result])
    elif not isinstance(result, pa.Table):
        if type(result).__name__ != "DataFrame" or not hasattr(result, "to_dict"):
            return None
        result = pa.Table.from_pandas(result, preserve_index=False)
    if result.num_rows != rows:
        raise BadHandlerResult(f"handler returned {result.num_rows} rows for {rows} records")
    try:
        return result.select(schema.names).cast(schema)
    except (KeyError, pa.ArrowException, ValueError) as e:
        raise BadHandlerResult(f"handler's rows do not fit the output schema: {e}") from e


def per_row_results(result: Any, rows: int) -> Sequence[Any]:
    """`result` as one entry per input row; raises `BadHandlerResult` on a length mismatch."""
    if isinstance(result, (str, bytes, dict)) or not isinstance(result, Sequence):
        raise BadHandlerResult(
            f"handler returned {type(result).__name__}; return a table or one result per row"
        )
    if len(result) != rows:
        raise BadHandlerResult(f"handler returned {len(result)} results for {rows} records")
    return result
