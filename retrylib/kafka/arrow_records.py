"""Kafka records as Spark and Arrow rows: the schema of Spark's built-in Kafka source, the
schema of offset ranges, and confluent-kafka messages turned into one Arrow RecordBatch.
"""

from __future__ import annotations

import inspect
import itertools

import pyarrow as pa
from confluent_kafka import TIMESTAMP_CREATE_TIME, TIMESTAMP_LOG_APPEND_TIME, Message
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

KAFKA_SCHEMA = StructType(
    [
        StructField("key", BinaryType()),
        StructField("value", BinaryType()),
        StructField("topic", StringType()),
        StructField("partition", IntegerType()),
        StructField("offset", LongType()),
        StructField("timestamp", TimestampType()),
        StructField("timestampType", IntegerType()),
        StructField(
            "headers",
            ArrayType(
                StructType([StructField("key", StringType()), StructField("value", BinaryType())])
            ),
        ),
    ]
)
"""The schema of Spark's built-in Kafka source (with `includeHeaders`), which this source emits."""

HEADERS_TYPE = pa.list_(pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())]))
"""A Kafka record's headers as Arrow, wherever retrylib keeps them (outgoing records, the
dead-letter table, an Arrow handler's batches)."""

HeaderPairs = list[tuple[str, bytes | None]]


def header_lists(column: pa.Array | pa.ChunkedArray) -> list[HeaderPairs]:
    """Each row's headers in a `HEADERS_TYPE` column, as (key, value) pairs (an empty list
    for a null).

    Built column by column: `to_pylist` makes a dict per header, which then has to become a
    pair, and a storm's every record carries some eight headers.
    """
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    if column.null_count:
        return [[(h["key"], h["value"]) for h in row or ()] for row in column.to_pylist()]
    flat = column.flatten()  # the slice's headers; its offsets count from the unsliced start
    keys, values = flat.field("key").to_pylist(), flat.field("value").to_pylist()
    pairs = list(zip(keys, values, strict=True))
    offsets = column.offsets.to_pylist()
    base = offsets[0]
    return [pairs[start - base : end - base] for start, end in itertools.pairwise(offsets)]


def utc_arrow_schema(schema: StructType) -> pa.Schema:
    """`schema` as Arrow, timestamps as UTC microseconds: what Spark expects of `read()`.

    Spark 4.2's `to_arrow_schema` needs the time zone named (`timezone=`); 4.0/4.1 take no
    such argument and always use UTC.
    """
    if "timezone" in inspect.signature(to_arrow_schema).parameters:
        return to_arrow_schema(schema, timezone="UTC")
    return to_arrow_schema(schema)


KAFKA_ARROW_SCHEMA = utc_arrow_schema(KAFKA_SCHEMA)
"""`KAFKA_SCHEMA` as Arrow: the schema of every RecordBatch `read()` yields (timestamps in µs)."""

RANGE_SCHEMA = StructType(
    [
        StructField("topic", StringType()),
        StructField("partition", IntegerType()),
        StructField("startOffset", LongType()),
        StructField("endOffset", LongType()),
        StructField("recordsLost", LongType()),
    ]
)
"""The schema with `retrylib.emit = ranges`: offsets `startOffset` (inclusive) to `endOffset`
(exclusive) of one topic-partition per row, one row per offset range of the batch.

`recordsLost` is set on one row of a batch (null on the others): the records the reader saw
waiting unread in topics deleted since (`failOnDataLoss` false), for the batch's
`records_lost`. A batch with no range to read carries it on an empty range."""

KEY_RANGE_SCHEMA = StructType([*RANGE_SCHEMA.fields, StructField("keyQueues", BinaryType())])
"""`RANGE_SCHEMA` with `retrylib.keyOrder`: a key group's first row carries the queues of its
keys (`retrylib.retry.key_order`, JSON); its other rows, null."""

_CONFLUENT_TO_SPARK_TIMESTAMP_TYPE = {TIMESTAMP_CREATE_TIME: 0, TIMESTAMP_LOG_APPEND_TIME: 1}
_NO_TIMESTAMP_TYPE = -1  # Kafka's TimestampType.NO_TIMESTAMP_TYPE


def to_batch(topic: str, partition: int, messages: list[Message]) -> pa.RecordBatch:
    """`messages` of `topic`[`partition`] as one RecordBatch of `KAFKA_ARROW_SCHEMA` (one pass
    over them)."""
    keys, values, offsets, micros, kinds, headers = [], [], [], [], [], []
    for message in messages:
        confluent_kind, millis = message.timestamp()
        kind = _CONFLUENT_TO_SPARK_TIMESTAMP_TYPE.get(confluent_kind, _NO_TIMESTAMP_TYPE)
        keys.append(message.key())
        values.append(message.value())
        offsets.append(message.offset())
        micros.append(None if kind == _NO_TIMESTAMP_TYPE else millis * 1000)
        kinds.append(kind)
        headers.append(message.headers() or [])
    schema = KAFKA_ARROW_SCHEMA
    columns = {
        "key": keys,
        "value": values,
        "topic": [topic] * len(messages),
        "partition": [partition] * len(messages),
        "offset": offsets,
        "timestamp": micros,
        "timestampType": kinds,
        "headers": headers,
    }
    return pa.RecordBatch.from_arrays(
        [pa.array(columns[f.name], type=f.type) for f in schema], schema=schema
    )
