"""The outgoing records, the Kafka-bound ones (for retry tiers, the dead-letter topic, a delay
router's destinations): their Arrow form, and producing one batch of them with every delivery
checked.

The routing tasks return a batch's outgoing records as Arrow RecordBatches of
`OUTGOING_SCHEMA` (kept in the batch's staging folder until produced);
`transactional_producer.UnitProducer` produces them inside its transaction through
`produce_outgoing`, and `Deliveries` tells, before the commit, whether the broker took them all.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence

import pyarrow as pa
from confluent_kafka import KafkaError, KafkaException, Producer

from retrylib.errors import RecordTooLargeError, RetrylibError
from retrylib.kafka.arrow_records import HEADERS_TYPE, header_lists
from retrylib.kafka.reading import produce
from retrylib.kafka.record_size import producer_limit, wire_size

OUTGOING_SCHEMA = pa.schema(
    [
        pa.field("topic", pa.string(), nullable=False),
        pa.field("partition", pa.int32()),  # null: the producer's partitioner, by key
        pa.field("timestamp_ms", pa.int64(), nullable=False),
        pa.field("key", pa.binary()),
        pa.field("value", pa.binary()),
        pa.field("headers", HEADERS_TYPE),
    ]
)


class OutgoingBuffer:
    """The outgoing records a task gathers, kept column by column until `take` hands them
    over as one RecordBatch of `OUTGOING_SCHEMA` (a dict per record for Arrow's
    `from_pylist` cost twice as much, with every failed record of a storm an outgoing one)."""

    def __init__(self) -> None:
        self._columns: tuple[list, ...] = tuple([] for _ in OUTGOING_SCHEMA)

    def add(
        self,
        topic: str,
        partition: int | None,
        timestamp_ms: int,
        key: bytes | None,
        value: bytes | None,
        headers: Sequence[tuple[str, bytes | None]],
    ) -> None:
        """Add a record for `topic`'s `partition` (None: the producer's partitioner)."""
        topics, partitions, timestamps, keys, values, header_lists = self._columns
        topics.append(topic)
        partitions.append(partition)
        timestamps.append(timestamp_ms)
        keys.append(key)
        values.append(value)
        header_lists.append(headers)

    def take(self) -> pa.RecordBatch | None:
        """The records added since the last `take`, or None when there are none."""
        if not self._columns[0]:
            return None
        columns = zip(self._columns, OUTGOING_SCHEMA, strict=True)
        arrays = [pa.array(column, field.type) for column, field in columns]
        self._columns = tuple([] for _ in OUTGOING_SCHEMA)
        return pa.RecordBatch.from_arrays(arrays, schema=OUTGOING_SCHEMA)


_PLAIN_COLUMNS = [name for name in OUTGOING_SCHEMA.names if name != "headers"]

OutgoingRecords = Callable[[], Iterable[pa.RecordBatch]]
"""Returns a fresh iterator of RecordBatches with the `OUTGOING_SCHEMA` columns on each call."""

_TOO_LARGE = KafkaError.MSG_SIZE_TOO_LARGE
_NO_SUCH_PARTITION = frozenset(
    {KafkaError._UNKNOWN_PARTITION, KafkaError._UNKNOWN_TOPIC, KafkaError.UNKNOWN_TOPIC_OR_PART}
)


class PartitionMissing(KafkaException):
    """Kafka knew no partition `partition` of `topic`, or no such topic, for a record produced
    to it: the topic may have been deleted, or created again with fewer partitions, since the
    job looked its partitions up (`UnitProducer` asks Kafka which)."""

    def __init__(self, error: KafkaError, topic: str, partition: int | None) -> None:
        super().__init__(error)
        self.topic = topic
        self.partition = partition


def produce_outgoing(
    producer: Producer,
    batch_id: int,
    records: OutgoingRecords,
    deliveries: Deliveries,
    options: Mapping[str, str],
) -> int:
    """Queue every record that `records()` yields for batch `batch_id`; returns the count.

    `options` are the job's Kafka options (their `message.max.bytes`, for the message).
    Raises `RetrylibError` when a RecordBatch lacks a column, `RecordTooLargeError` when the
    producer refuses a record as over its `message.max.bytes`, `KafkaException` otherwise.
    """
    count = 0
    for batch in records():
        missing = [n for n in OUTGOING_SCHEMA.names if batch.schema.get_field_index(n) < 0]
        if missing:
            raise RetrylibError(
                f"the outgoing records of batch {batch_id} lack column(s) {missing}: got "
                f"columns {batch.schema.names}, expected {OUTGOING_SCHEMA.names}"
            )
        columns = [batch.column(name).to_pylist() for name in _PLAIN_COLUMNS]
        header_pairs = header_lists(batch.column("headers"))
        for topic, partition, timestamp_ms, key, value, pairs in zip(
            *columns, header_pairs, strict=True
        ):
            try:
                produce(
                    producer,
                    topic,
                    key=key,
                    value=value,
                    headers=pairs,
                    partition=partition,
                    timestamp_ms=timestamp_ms,
                    on_delivery=deliveries,
                )
            except KafkaException as e:
                if _code(e) in _NO_SUCH_PARTITION:
                    raise PartitionMissing(e.args[0], topic, partition) from e
                if not too_large(e):
                    raise
                raise RecordTooLargeError(
                    f"batch {batch_id}: a record of {wire_size(key, value, pairs)} bytes "
                    f"for {topic}[{partition}] is over the {producer_limit(options)} "
                    "bytes retrylib's producer accepts: set [kafka] options "
                    '"message.max.bytes" higher (at most the topic\'s max.message.bytes)'
                ) from e
        count += batch.num_rows
    return count


def too_large(error: KafkaException) -> bool:
    """True when `error` says a record is over a size limit."""
    return _code(error) == _TOO_LARGE


def _code(error: KafkaException) -> int | None:
    kafka_error = error.args[0] if error.args else None
    return kafka_error.code() if isinstance(kafka_error, KafkaError) else None


class Deliveries:
    """Delivery reports of one transaction: the first error, if any."""

    def __init__(self) -> None:
        self.error: KafkaError | None = None
        # The first record the broker refused as too large: (topic, partition, size).
        self.too_large: tuple[str, int, int] | None = None
        # The first record whose topic or partition Kafka did not know.
        self.missing: PartitionMissing | None = None

    def __call__(self, error: KafkaError | None, message) -> None:
        if error is None:
            return
        if self.error is None:
            self.error = error
        if error.code() == _TOO_LARGE and self.too_large is None:
            size = wire_size(message.key(), message.value(), message.headers() or [])
            self.too_large = (message.topic(), message.partition(), size)
        if error.code() in _NO_SUCH_PARTITION and self.missing is None:
            self.missing = PartitionMissing(error, message.topic(), message.partition())

    def check(self, left: int, topic_max_bytes: Mapping[str, int]) -> None:
        """Raise `KafkaException` unless every record was delivered (`left` still queued),
        `RecordTooLargeError` when the broker refused one as too large (`topic_max_bytes`:
        the topics' `max.message.bytes` as last looked up, for the message), `PartitionMissing`
        when Kafka did not know a record's topic or partition."""
        if self.too_large is not None:
            topic, partition, size = self.too_large
            limit = topic_max_bytes.get(topic, "unknown")
            raise RecordTooLargeError(
                f"the broker refused a record of {size} bytes for {topic}[{partition}], or the "
                f"batch holding it, as over the topic's max.message.bytes ({limit}): raise "
                f'max.message.bytes of {topic}, or set [kafka] options "batch.size" lower '
                "if the record alone is under it"
            ) from KafkaException(self.error)
        if self.missing is not None:
            raise self.missing
        if self.error is not None:
            raise KafkaException(self.error)
        if left:
            raise KafkaException(
                KafkaError(KafkaError._TIMED_OUT, f"{left} record(s) not delivered in time")
            )
