"""The reader of one offset range of one Kafka partition: what a Spark task of the
`retrylib_kafka` source reads (`read_range`), and what the routing task reads itself when the
source emits ranges (`read_messages`).

A range is read exactly: every record from its start offset up to its end offset, in order,
or the read fails naming the range. Offsets without a record for this reader (transaction
markers, aborted transactions under read_committed, compaction) are skipped without waiting
for them. The reads of one Python worker share its consumers (`worker_clients`): one per
set of settings, assigned each range in turn, across tasks and batches.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pyarrow as pa
from confluent_kafka import Consumer, KafkaError, Message, TopicPartition
from pyspark.sql.datasource import InputPartition

from retrylib.errors import KafkaSourceError
from retrylib.kafka import worker_clients
from retrylib.kafka.arrow_records import to_batch
from retrylib.kafka.reading import arrived, watermarks
from retrylib.logs import redact

log = logging.getLogger(__name__)

# "error", not "earliest": a fetch offset the broker no longer holds (records deleted by
# retention or delete-records) would otherwise be moved silently to the log's new start,
# and the read would end at the partition's end having skipped every record in between.
# With "error" the consumer only moves past offsets it fetched, so a read that reaches
# `end` has seen every record of its range (see `_message_chunks`).
# fetch.wait.max.ms 10 (the clients' default is 100): a range that ends at the partition's
# end is done only after an empty fetch, which the broker holds that long, and one that ends
# at a transaction marker takes two, paid range after range. Measured on a one-partition
# topic: 107-114 ms for a 20-record range at 100, 19-20 ms at 10; 214-219 ms against 23-38 ms
# for a tier range ending at its marker. A range reader is assigned only while it reads
# (`worker_clients.kept_consumer` unassigns it), so the shorter wait costs no idle fetches.
_READ_CLIENT_OPTIONS = {
    "auto.offset.reset": "error",
    "enable.partition.eof": True,
    "fetch.wait.max.ms": 10,
}

BATCH_ROWS = 10_000
"""Rows per RecordBatch that `read()` yields, and most messages taken at once (`arrived`)."""
POLL_TIMEOUT_S = 0.05
"""Longest wait for the next fetched message (`arrived`); the read loops until the range is
done or stalls."""
STALL_TIMEOUT_S = 120.0
"""A read that gets no record for this long fails instead of hanging."""
METADATA_TIMEOUT_S = 30.0
"""How long a look-up of partitions or offsets waits for the broker."""


@dataclass
class KafkaInputPartition(InputPartition):
    """Offsets `start` to `end` (exclusive) of `topic[partition]`, read by one Spark task."""

    topic: str
    partition: int
    start: int
    end: int
    bootstrap_servers: str
    client_options: dict[str, str]
    secret_options: tuple[str, ...] = ()  # names among client_options
    fail_on_data_loss: bool = True  # false: records deleted before the read are skipped


LostRecords = Callable[[int], None]
"""Told how many records of a range were deleted from Kafka before they were read, when
`fail_on_data_loss` is false and the read skips them."""


def read_range(
    part: KafkaInputPartition, on_lost: LostRecords | None = None
) -> Iterator[pa.RecordBatch]:
    """Yield `part`'s records as RecordBatches of `KAFKA_ARROW_SCHEMA`, at most `BATCH_ROWS`
    rows each. Fails, or skips deleted records, as `read_messages` does."""
    pending: list[Message] = []
    for chunk in read_messages(part, on_lost):
        pending.extend(chunk)
        while len(pending) >= BATCH_ROWS:
            yield to_batch(part.topic, part.partition, pending[:BATCH_ROWS])
            del pending[:BATCH_ROWS]
    if pending:
        yield to_batch(part.topic, part.partition, pending)


def read_messages(
    part: KafkaInputPartition, on_lost: LostRecords | None = None
) -> Iterator[list[Message]]:
    """Yield `part`'s records in offset order, as lists of at most `BATCH_ROWS` messages.

    Offsets inside the range that hold no record for this reader (transaction markers,
    records of aborted transactions under read_committed, compacted records) are skipped:
    the read ends at the first offset >= `part.end`, or when the partition's end (its high
    watermark, or last stable offset under read_committed) is at or past it. Raises
    `KafkaSourceError` naming the range on a message error, a stalled read, or records
    deleted from the broker (retention, delete-records) before they were read. With
    `part.fail_on_data_loss` false, deleted records are skipped instead: a warning names
    them and `on_lost` is told how many.

    The consumer is this Python worker's, kept for its next reads with the same settings
    (`worker_clients.kept_consumer`); a read that fails, or is not read to its end, closes it.
    """
    with worker_clients.kept_consumer(
        part.bootstrap_servers,
        {**part.client_options, **_READ_CLIENT_OPTIONS},
        secret_options=part.secret_options,
    ) as consumer:
        consumer.assign([TopicPartition(part.topic, part.partition, part.start)])
        yield from _message_chunks(consumer, part, on_lost)


def _message_chunks(
    consumer: Consumer, part: KafkaInputPartition, on_lost: LostRecords | None
) -> Iterator[list[Message]]:
    """The messages of `part`'s range in offset order, one list per `arrived` call.

    The consumer never resets its position (`auto.offset.reset` = error): it reaches an
    offset only by fetching the log up to it. So a partition end (EOF) at or past
    `part.end` proves that every offset before it was fetched, and the ones not delivered
    hold no committed record; the read may end there, short of `part.end` records.
    """
    next_offset = part.start
    delivered = lost = 0
    deadline = time.monotonic() + STALL_TIMEOUT_S
    while next_offset < part.end:
        wanted = min(part.end - next_offset, BATCH_ROWS)
        chunk, finished = [], False
        for message in arrived(consumer, wanted, POLL_TIMEOUT_S):
            error = message.error()
            if error is not None and error.code() == KafkaError._AUTO_OFFSET_RESET:
                resumed = _skip_lost(consumer, part, next_offset, error, on_lost)
                lost += min(resumed, part.end) - next_offset
                next_offset = resumed
                deadline = time.monotonic() + STALL_TIMEOUT_S
                break
            if error is not None and error.code() != KafkaError._PARTITION_EOF:
                raise KafkaSourceError(redact(f"reading {_describe(part)}: {error}"))
            offset = message.offset()
            if offset >= part.end:  # a record or the partition's end (EOF) past the range
                finished = True
                break
            if error is None and offset >= next_offset:
                chunk.append(message)
                next_offset = offset + 1
        if chunk:
            delivered += len(chunk)
            yield chunk
            deadline = time.monotonic() + STALL_TIMEOUT_S
        if finished:
            break
        if time.monotonic() > deadline:
            raise KafkaSourceError(
                f"reading {_describe(part)}: nothing received for {STALL_TIMEOUT_S:.0f}s "
                f"at offset {next_offset}"
            )
    skipped = part.end - part.start - delivered - lost
    if skipped:
        log.debug(
            "%s: %d record(s), %d offset(s) without a record for this reader (transaction "
            "markers, aborted transactions, compaction)",
            _describe(part),
            delivered,
            skipped,
        )


def _skip_lost(
    consumer: Consumer,
    part: KafkaInputPartition,
    next_offset: int,
    error: KafkaError,
    on_lost: LostRecords | None,
) -> int:
    """Where the read goes on after a fetch offset the broker no longer holds: the log's new
    start, when records were deleted and `part.fail_on_data_loss` is false.

    Raises `KafkaSourceError` naming the range, the offsets and the log's bounds otherwise.
    """
    try:
        [(low, high)] = watermarks(
            consumer, [(part.topic, part.partition)], METADATA_TIMEOUT_S
        ).values()
    except Exception as e:  # the error below still names the range and the offset
        raise KafkaSourceError(
            f"reading {_describe(part)}: offset {next_offset} is out of range ({error}); "
            f"the partition's offsets could not be listed: {e}"
        ) from e
    if low <= next_offset:
        raise KafkaSourceError(
            f"reading {_describe(part)}: offset {next_offset} is outside the partition's "
            f"offsets {low}..{high} ({error}); was the topic deleted and re-created, or its "
            "log truncated?"
        )
    lost = f"{part.topic}[{part.partition}]@{next_offset}..{min(low, part.end) - 1}"
    if part.fail_on_data_loss:
        raise KafkaSourceError(
            f"reading {_describe(part)}: records {lost} were deleted from Kafka before they "
            f"were read (the partition now starts at offset {low}: retention.ms, "
            "retention.bytes or delete-records); they cannot be processed, so the read fails "
            "rather than skip them (kafka.fail_on_data_loss = false skips them)"
        )
    log.warning(
        "reading %s: records %s were deleted from Kafka before they were read (the partition "
        "now starts at offset %d); skipped, as failOnDataLoss is false",
        _describe(part),
        lost,
        low,
    )
    if on_lost is not None:
        on_lost(min(low, part.end) - next_offset)
    if low < part.end:
        consumer.assign([TopicPartition(part.topic, part.partition, low)])
    return low


def _describe(part: KafkaInputPartition) -> str:
    return f"{part.topic}[{part.partition}] offsets {part.start}..{part.end}"
