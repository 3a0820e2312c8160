"""Reading Kafka: each read's isolation level, reads to a known end, and the one call that
queues a record for a producer.

- `reading_options` decides a consumer's options for what it reads (`Reading`): whether the
  user's `isolation.level` or read_committed wins is decided there and nowhere else
  (`KafkaOffsets` asks the admin API for read_committed offsets, a request's own setting).
- `ReadToEnd` reads partitions read_committed from start offsets (or their earliest) to the
  end offsets captured when the read starts: what `status` counts in a tier, the markers
  `redrive` looks for, what the tests read back. Records produced after
  the read started are not read, so a read of a busy topic ends.
- `last_marker` finds the last committed marker in a control topic.
- `produce` queues one record, waiting while the producer's local queue is full.
- `KafkaOffsets` looks up many partitions' offsets at once (latest, earliest, by time).

The topic look-up (which partitions a topic has) is `clients.topic_partitions`, next to the
topic administration that needs it.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from enum import Enum

from confluent_kafka import (
    Consumer,
    IsolationLevel,
    KafkaError,
    KafkaException,
    Message,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, OffsetSpec

from retrylib.errors import MarkerReadError, causes
from retrylib.kafka.clients import client_config, make_consumer, topic_partitions
from retrylib.kafka.offsets import PartitionKey

READ_COMMITTED = {"isolation.level": "read_committed"}
"""The consumer setting of every read of records produced in transactions (retry tiers,
delay topics, control topics; main topics unless the user's options say otherwise): a read
stops at the last stable offset (never past an open transaction) and skips the records of
aborted ones."""
READ_TO_END_OPTIONS = {
    **READ_COMMITTED,
    "enable.partition.eof": True,
    "auto.offset.reset": "earliest",
    "fetch.wait.max.ms": 10,
}
"""Consumer settings of a `ReadToEnd`: only committed records (a read stops at the last stable
offset and skips aborted transactions), the partition's end reported (EOF), a start offset
that retention has already deleted read from the log's new start, and a short wait for a
fetch that finds nothing new. The end is known only from such a fetch, which the broker
holds for `fetch.wait.max.ms` (the job's clients' default is 100): a read of a few
control-topic records took 105 ms with 50 and 24 ms with 10 (taking what has arrived,
`arrived`). A `ReadToEnd` unassigns its partitions once read, so an idle consumer does not
fetch at that pace."""
_HIGH_WATERMARK_OPTIONS = {"isolation.level": "read_uncommitted"}


class Reading(Enum):
    """What a consumer reads, which decides its options over the user's (`reading_options`)."""

    MAIN_TOPICS = "main topics"
    """The job's main topics (either source): read_committed unless the user's options set
    `isolation.level`, so the records of aborted transactions (a failed `retrylib redrive`,
    a user's transactional producer) never reach the handler by default."""
    DELAYED_TOPICS = "delayed topics"
    """The topics read up to a delay frontier (`config.delayed_topics`: the retry tiers,
    which retrylib writes in transactions, or a delay router's topics): read_committed
    whatever the user's options say, so that a read, the source's offset look-ups included
    (its driver looks up the main topics with these options too), stops before an open
    transaction."""
    TO_END = "to end"
    """A `ReadToEnd` (control topics' markers, the job's and redrive's; a tier's backlog for
    `status` and the metrics; a tier's tail for the source): `READ_TO_END_OPTIONS` win."""
    HIGH_WATERMARK = "high watermark"
    """A look-up of a partition's high watermark: read_uncommitted whatever the user's
    options say, since a read_committed consumer's watermark is the last stable offset."""


def reading_options(options: Mapping[str, str], reading: Reading) -> dict[str, str]:
    """The consumer options of a read of `reading`: the user's `options` with the read's own
    settings, of which only a main topic's `isolation.level` gives way to the user's."""
    if reading is Reading.MAIN_TOPICS:
        return {**READ_COMMITTED, **options}
    if reading is Reading.TO_END:
        return {**options, **READ_TO_END_OPTIONS}
    if reading is Reading.HIGH_WATERMARK:
        return {**options, **_HIGH_WATERMARK_OPTIONS}
    return {**options, **READ_COMMITTED}


WATERMARK_TIMEOUT_S = 15.0
OFFSETS_TIMEOUT_S = 10.0
MARKER_WINDOW = 64
"""Offsets of a control topic read first when looking for the last marker (then 2x, 4x...)."""
MARKER_READ_TIMEOUT_S = 30.0
"""A marker read that reaches neither its window's end nor the partition's end in this long
fails instead of guessing."""
_CONSUME_BATCH = 500
_CONSUME_WAIT_S = 0.1  # the longest wait for a first record (`arrived`)


def reading_consumer(
    bootstrap_servers: str, options: Mapping[str, str], group_id: str = "retrylib-reader"
) -> Consumer:
    """A consumer for `ReadToEnd`, with the user's `options` (`Reading.TO_END`).

    Raises `KafkaException` when librdkafka refuses the configuration.
    """
    return make_consumer(bootstrap_servers, reading_options(options, Reading.TO_END), group_id)


def arrived(consumer: Consumer, most: int, wait_s: float) -> list[Message]:
    """Up to `most` of the records and events (a partition's end, errors) `consumer` has
    fetched, waiting at most `wait_s` for the first when it has none.

    `consume(most, timeout)` alone waits out its whole timeout whenever fewer than `most`
    arrive, which the read of a short range, or of a partition's last records, always meets.
    """
    first = consumer.poll(wait_s)
    if first is None:
        return []
    return [first, *consumer.consume(most - 1, timeout=0)] if most > 1 else [first]


def watermarks(
    consumer: Consumer, keys: Iterable[PartitionKey], timeout: float = WATERMARK_TIMEOUT_S
) -> dict[PartitionKey, tuple[int, int]]:
    """(low, high) watermark of each partition, asked of the broker (never cached). For a
    read_committed consumer the high one is the last stable offset.

    Raises `KafkaException` when the broker does not answer within `timeout` or a partition
    does not exist (`UNKNOWN_TOPIC_OR_PART`).
    """
    return {
        key: consumer.get_watermark_offsets(TopicPartition(*key), timeout=timeout, cached=False)
        for key in keys
    }


class KafkaOffsets:
    """Offset look-ups for many partitions at once (AdminClient ListOffsets, read_committed),
    with the job's pass-through Kafka options.
    """

    def __init__(
        self,
        bootstrap_servers: str,
        options: Mapping[str, str],
        timeout: float = OFFSETS_TIMEOUT_S,
        errors: list[KafkaError] | None = None,
    ) -> None:
        """`errors`, when given, collects the client's connection errors."""
        settings = client_config(bootstrap_servers, options)
        if errors is not None:
            settings["error_cb"] = errors.append
        self.admin = AdminClient(settings)
        self.timeout = timeout

    def serve_errors(self) -> None:
        """Hand the client's connection errors so far to `errors` (callbacks wait for this)."""
        self.admin.poll(0)

    def partitions(self, topics: Iterable[str], pattern: str | None = None) -> dict[str, list[int]]:
        """Partition numbers of each existing topic among `topics`, then of those matching
        `pattern` (see `topic_partitions`; missing ones left out).

        Raises `KafkaException` when the broker does not answer within the timeout.
        """
        return topic_partitions(self.admin, topics, self.timeout, pattern)

    def latest(self, keys: Iterable[PartitionKey]) -> dict[PartitionKey, int]:
        return self._list({key: OffsetSpec.latest() for key in keys})

    def earliest(self, keys: Iterable[PartitionKey]) -> dict[PartitionKey, int]:
        return self._list({key: OffsetSpec.earliest() for key in keys})

    def first_at(self, times_ms: Mapping[PartitionKey, int]) -> dict[PartitionKey, int]:
        """The first offset with a timestamp at or after the given time; -1 when none."""
        return self._list({key: OffsetSpec.for_timestamp(ms) for key, ms in times_ms.items()})

    def _list(self, specs: Mapping[PartitionKey, OffsetSpec]) -> dict[PartitionKey, int]:
        if not specs:
            return {}
        futures = self.admin.list_offsets(
            {TopicPartition(topic, partition): spec for (topic, partition), spec in specs.items()},
            isolation_level=IsolationLevel.READ_COMMITTED,
            request_timeout=self.timeout,
        )
        return {(tp.topic, tp.partition): f.result().offset for tp, f in futures.items()}


class ReadToEnd:
    """One read of partitions from their start offsets to their end offsets.

    A partition is done once a record or its end (EOF) at or past its end offset arrives:
    offsets that hold no committed record (transaction markers, aborted transactions) need
    no waiting. `next_offset` follows the records read; `unfinished` names the partitions
    that `messages` left before their end (out of time or at its `limit`), and `ended_short`
    those whose end (EOF) came before their end offset: a read_committed read stops at an
    open transaction, and a log that shrank (a topic created again) ends there too.
    """

    def __init__(
        self,
        consumer: Consumer,
        start: Mapping[PartitionKey, int],
        end: Mapping[PartitionKey, int] | None = None,
    ) -> None:
        """Read `consumer` (a `reading_consumer`) from `start`; `end` are the end offsets,
        else each partition's high watermark now. Raises as `watermarks`."""
        self._consumer = consumer
        if end is None:
            end = {key: high for key, (_, high) in watermarks(consumer, start).items()}
        self.end = dict(end)
        self.next_offset = dict(start)
        self._open = {key for key, offset in start.items() if self.end[key] > offset}
        self.ended_short: set[PartitionKey] = set()

    @classmethod
    def from_earliest(cls, consumer: Consumer, keys: Iterable[PartitionKey]) -> ReadToEnd:
        """A read of every record of partitions `keys`: low to high watermark, as of now."""
        marks = watermarks(consumer, keys)
        return cls(
            consumer,
            {key: low for key, (low, _) in marks.items()},
            {key: high for key, (_, high) in marks.items()},
        )

    @property
    def unfinished(self) -> dict[PartitionKey, int]:
        """The next offset to read of each partition not read to its end."""
        return {key: self.next_offset[key] for key in sorted(self._open)}

    def messages(self, timeout_s: float, limit: int | None = None) -> Iterator[Message]:
        """Yield the records of the open partitions, in offset order within each, until
        every partition is done, `limit` records were yielded, or `timeout_s` has passed.

        Raises `KafkaException` for an error message other than a partition's end. The
        partitions are unassigned when it ends, or when its caller stops taking records.
        """
        if not self._open:
            return
        consumer = self._consumer
        consumer.assign([TopicPartition(*key, self.next_offset[key]) for key in sorted(self._open)])
        try:
            yield from self._read(timeout_s, limit)
        finally:
            # An assigned consumer goes on fetching, every `fetch.wait.max.ms` once at the
            # end. A failed unassign leaves only that, and must not hide the read's error.
            with contextlib.suppress(KafkaException):
                consumer.unassign()

    def _read(self, timeout_s: float, limit: int | None) -> Iterator[Message]:
        deadline = time.monotonic() + timeout_s
        left = limit
        while self._open and (left is None or left > 0) and time.monotonic() < deadline:
            wanted = _CONSUME_BATCH if left is None else min(_CONSUME_BATCH, left)
            for message in arrived(self._consumer, wanted, _CONSUME_WAIT_S):
                key = (message.topic(), message.partition())
                if key not in self._open:
                    continue
                error = message.error()
                if error is not None and error.code() != KafkaError._PARTITION_EOF:
                    raise KafkaException(error)
                if error is not None or message.offset() >= self.end[key]:
                    self._open.discard(key)
                    if error is not None and message.offset() < self.end[key]:
                        self.ended_short.add(key)
                    continue
                self.next_offset[key] = message.offset() + 1
                if left is not None:
                    left -= 1
                yield message


def last_marker(
    consumer: Consumer, topic: str, number: Callable[[Message], int | None]
) -> int | None:
    """The highest `number(record)` among the committed records in partition 0 of `topic`
    (records it gives None for are passed over), or None when there is none.

    Reads backwards from the end in windows of `MARKER_WINDOW` offsets, doubled each time, so
    that any number of aborted transactions (their records and markers take offsets) cannot
    hide the last committed marker, and a long log is not read whole. Raises `KafkaException`
    when the topic cannot be read, and `MarkerReadError` when a window is not read to its end
    within `MARKER_READ_TIMEOUT_S`: it never answers None for a topic it could not read.
    """
    partition = (topic, 0)
    [(low, high)] = watermarks(consumer, [partition]).values()
    end, window = high, MARKER_WINDOW
    while end > low:
        start = max(low, end - window)
        read = ReadToEnd(consumer, {partition: start}, {partition: end})
        numbers = [
            found
            for message in read.messages(MARKER_READ_TIMEOUT_S)
            if (found := number(message)) is not None
        ]
        if read.unfinished:
            raise MarkerReadError(
                f"reading {topic} offsets {start}..{end}: no answer for "
                f"{MARKER_READ_TIMEOUT_S:.0f}s"
            )
        if numbers:
            return max(numbers)
        end, window = start, window * 2
    return None


def produce(
    producer: Producer,
    topic: str,
    *,
    key: bytes | None,
    value: bytes | None,
    headers: list[tuple[str, bytes | None]] | None = None,
    partition: int | None = None,
    timestamp_ms: int | None = None,
    on_delivery: Callable | None = None,
) -> None:
    """Queue one record; a full local queue is served (deliveries drain) and asked again.

    `partition` None leaves the choice to the producer's partitioner, `timestamp_ms` None
    stamps the record now. Raises `KafkaException` as `producer.produce` and `serve` do.
    """
    extra: dict[str, object] = {}
    if partition is not None:
        extra["partition"] = partition
    if timestamp_ms is not None:
        extra["timestamp"] = timestamp_ms
    if on_delivery is not None:
        extra["on_delivery"] = on_delivery
    while True:
        try:
            producer.produce(topic, key=key, value=value, headers=headers or [], **extra)
            return
        except BufferError:
            serve(producer.poll, 0.1)


def serve(call: Callable[[float], int], timeout: float) -> int:
    """`producer.flush` or `producer.poll`, which run delivery callbacks.

    After a fatal producer error (fenced, say) confluent-kafka calls the callbacks with that
    error already raised, which surfaces as a `SystemError`; it is raised here as the
    `KafkaException` it stands for.
    """
    try:
        return call(timeout)
    except SystemError as e:
        kafka = next((c for c in causes(e) if isinstance(c, KafkaException)), None)
        if kafka is not None:
            raise kafka from None
        raise KafkaException(KafkaError(KafkaError._FAIL, f"producer failed: {e}")) from e
