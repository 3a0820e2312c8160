"""Kafka as a Spark Structured Streaming source, written as a Python Data Source.

`spark.readStream.format("retrylib_kafka")` reads Kafka through confluent-kafka and emits
exactly the schema of Spark's built-in `kafka` source, with the same option names
(`kafka.bootstrap.servers`, `subscribe`, `startingOffsets`, `maxOffsetsPerTrigger`,
`kafka.*` pass-through), so a job can switch between the two formats.

Options of its own:

- `retrylib.emit`: `records` (the default, the built-in schema) or `ranges`: one row per
  offset range (`RANGE_SCHEMA`) and no records. The retrylib job reads the ranges itself in
  the task that routes them (`read_messages`), so records never pass through the JVM.
  With `retrylib.rangeGroups = N` a batch's ranges come in at most N input partitions,
  balanced by record count: Spark pays a Python worker round trip per input partition.
- `retrylib.topicDelaysMs`: a JSON object naming subscribed topics that are fixed-delay
  retry tiers, with their delays: `{"orders.retry.5s": 5000}`. The source is a delay
  frontier for them: a partition's end offset is the first record whose Kafka timestamp
  is after `now - delay` (found with `offsets_for_times`, no scanning), so records become
  visible once due and batches run as time passes, with no new data needed. A new query
  reads a tier from its earliest offset, whatever `startingOffsets` says (a tier holds
  retries still owed), so one source serves the main topics and every tier.
- `retrylib.maxRecordsPerTask`: the longest offset range one Spark task reads (250000).
- `retrylib.availableNowOffsets`: offsets JSON (`{"topic": {"0": 12}}`) the source reads up
  to and no further, for an availableNow run on Spark 4.0/4.1 (see below).

Batches are bounded and availableNow works the same on Spark 4.0, 4.1 and 4.2. Spark 4.2
passes the reader each batch's start offsets and read limit (`maxOffsetsPerTrigger`) and
supports `Trigger.AvailableNow` for Python sources. Spark 4.0/4.1 call `latestOffset()` with
no arguments and run `Trigger.AvailableNow` as one unbounded batch, so there the reader does
it itself: it remembers the end it returned last (and, after a restart, the offsets the
engine hands `partitions()` from its checkpoint before asking for new ones), applies
`maxOffsetsPerTrigger` from there, and stops at `retrylib.availableNowOffsets`, with which
the job runs availableNow as a processing-time query it stops once there
(`retrylib.job`).
"""

from __future__ import annotations

import inspect
import json
import logging
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace

import pyarrow as pa
from confluent_kafka import (
    TIMESTAMP_CREATE_TIME,
    TIMESTAMP_LOG_APPEND_TIME,
    Consumer,
    KafkaError,
    Message,
    TopicPartition,
)
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
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

from retrylib.errors import RetrylibError, TopicError
from retrylib.kafka.clients import make_consumer
from retrylib.kafka.offsets import (
    EARLIEST,
    LATEST,
    Offsets,
    PartitionKey,
    StartingOffsets,
    cap_at_target,
    delay_frontier,
    floor_at,
    group_ranges,
    limit_offsets,
    offsets_from_json,
    offsets_to_json,
    parse_starting_offsets,
    parse_topics,
    resolve_starting_offsets,
    split_ranges,
    with_new_partitions,
)
from retrylib.logs import redact

try:  # Spark 4.2+: read limits and Trigger.AvailableNow for Python stream readers
    from pyspark.sql.streaming.datasource import (
        ReadAllAvailable,
        ReadLimit,
        ReadMaxRows,
        SupportsTriggerAvailableNow,
    )
except ImportError:  # Spark 4.0/4.1: the engine never asks for these
    ReadAllAvailable = ReadLimit = ReadMaxRows = None

    class SupportsTriggerAvailableNow:  # type: ignore[no-redef]
        """Stand-in base class on Spark versions without Trigger.AvailableNow for Python sources."""


ENGINE_LIMITS_PYTHON_SOURCES = ReadMaxRows is not None
"""True on Spark 4.2+, whose engine passes Python stream readers their start offsets and read
limits and runs `Trigger.AvailableNow` for them in bounded batches; False on 4.0/4.1."""


log = logging.getLogger(__name__)

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
    ]
)
"""The schema with `retrylib.emit = ranges`: offsets `startOffset` (inclusive) to `endOffset`
(exclusive) of one topic-partition per row, one row per offset range of the batch."""

OPTION_BOOTSTRAP = "kafka.bootstrap.servers"
OPTION_SUBSCRIBE = "subscribe"
OPTION_STARTING_OFFSETS = "startingOffsets"
OPTION_MAX_OFFSETS_PER_TRIGGER = "maxOffsetsPerTrigger"
OPTION_TOPIC_DELAYS_MS = "retrylib.topicDelaysMs"
OPTION_MAX_RECORDS_PER_TASK = "retrylib.maxRecordsPerTask"
OPTION_EMIT = "retrylib.emit"
OPTION_RANGE_GROUPS = "retrylib.rangeGroups"
OPTION_SECRET_OPTIONS = "retrylib.secretOptions"
"""JSON list of the `kafka.*` options (names without the prefix) whose values are secret:
masked in this source's log lines and errors, in every process that reads (see
`retrylib.kafka.clients.client_config`)."""

OPTION_AVAILABLE_NOW_OFFSETS = "retrylib.availableNowOffsets"
_EMIT_VALUES = ("records", "ranges")
_KNOWN_OPTIONS = {
    name.lower(): name
    for name in (
        OPTION_BOOTSTRAP,
        OPTION_SUBSCRIBE,
        OPTION_STARTING_OFFSETS,
        OPTION_MAX_OFFSETS_PER_TRIGGER,
        OPTION_TOPIC_DELAYS_MS,
        OPTION_MAX_RECORDS_PER_TASK,
        OPTION_EMIT,
        OPTION_RANGE_GROUPS,
        OPTION_SECRET_OPTIONS,
        OPTION_AVAILABLE_NOW_OFFSETS,
    )
}
# Consumer settings the source relies on; a user value would break offset-exact reads.
_RESERVED_CLIENT_OPTIONS = {"auto.offset.reset", "enable.auto.commit", "enable.partition.eof"}
# "error", not "earliest": a fetch offset the broker no longer holds (records deleted by
# retention or delete-records) would otherwise be moved silently to the log's new start,
# and the read would end at the partition's end having skipped every record in between.
# With "error" the consumer only moves past offsets it fetched, so a read that reaches
# `end` has seen every record of its range (see `_message_chunks`).
_READ_CLIENT_OPTIONS = {"auto.offset.reset": "error", "enable.partition.eof": True}

DEFAULT_MAX_RECORDS_PER_TASK = 250_000
BATCH_ROWS = 10_000
"""Rows per RecordBatch that `read()` yields, and most messages asked of one `consume()`."""
POLL_TIMEOUT_S = 0.05
"""Longest wait of one `consume()` call. `consume()` waits it out whenever fewer messages
than asked for arrive, which is every time a range holds gaps (transaction markers on
retry topics), so it is kept short; the read loops until the range is done or stalls."""
STALL_TIMEOUT_S = 120.0
"""A read that gets no record for this long fails instead of hanging."""
METADATA_TIMEOUT_S = 30.0
_RETRY_PAUSE_S = 0.2  # between asks for offsets the broker could not give yet

_CONFLUENT_TO_SPARK_TIMESTAMP_TYPE = {TIMESTAMP_CREATE_TIME: 0, TIMESTAMP_LOG_APPEND_TIME: 1}
_NO_TIMESTAMP_TYPE = -1  # Kafka's TimestampType.NO_TIMESTAMP_TYPE


class KafkaSourceError(RetrylibError):
    """Raised when reading Kafka fails: broker errors, missing partitions, a stalled read."""


@dataclass(frozen=True)
class SourceOptions:
    """The parsed options of one `retrylib_kafka` stream (see `parse_source_options`)."""

    bootstrap_servers: str
    topics: list[str]
    starting_offsets: StartingOffsets
    max_offsets_per_trigger: int | None = None
    delays_ms: dict[str, int] = field(default_factory=dict)  # retry tier topic -> its delay
    max_records_per_task: int = DEFAULT_MAX_RECORDS_PER_TASK
    client_options: dict[str, str] = field(default_factory=dict)
    secret_options: tuple[str, ...] = ()  # names among client_options
    emit_ranges: bool = False
    range_groups: int | None = None  # with emit_ranges: at most this many input partitions
    available_now_offsets: Offsets | None = None  # the end of an availableNow run on 4.0/4.1

    @property
    def schema(self) -> StructType:
        return RANGE_SCHEMA if self.emit_ranges else KAFKA_SCHEMA


def parse_source_options(options: Mapping[str, str]) -> SourceOptions:
    """Validate and parse the reader options (names are case-insensitive, as in Spark).

    `kafka.*` options other than `kafka.bootstrap.servers` go, prefix stripped, to every
    consumer. Raises `ValueError` naming the option for: a missing required option, an
    unknown option, a reserved consumer setting, or a value that does not parse.
    """
    lowered = {key.lower(): value for key, value in options.items()}
    client_options = {}
    for key, value in lowered.items():
        if key in _KNOWN_OPTIONS:
            continue
        if not key.startswith("kafka."):
            raise ValueError(
                f"unknown option {key!r} for the retrylib_kafka source; known options: "
                f"{sorted(_KNOWN_OPTIONS.values())} and kafka.* consumer settings"
            )
        if key[len("kafka.") :] in _RESERVED_CLIENT_OPTIONS:
            raise ValueError(f"option {key!r} is set by the retrylib_kafka source itself")
        client_options[key[len("kafka.") :]] = value
    bootstrap = lowered.get(OPTION_BOOTSTRAP.lower(), "").strip()
    if not bootstrap:
        raise ValueError(f"option {OPTION_BOOTSTRAP} is required")
    topics = parse_topics(lowered.get(OPTION_SUBSCRIBE.lower()))
    emit = lowered.get(OPTION_EMIT.lower(), "records").strip().lower()
    if emit not in _EMIT_VALUES:
        raise ValueError(f"option {OPTION_EMIT}={emit!r} must be one of {list(_EMIT_VALUES)}")
    return SourceOptions(
        bootstrap_servers=bootstrap,
        topics=topics,
        starting_offsets=parse_starting_offsets(
            lowered.get(OPTION_STARTING_OFFSETS.lower()), topics
        ),
        max_offsets_per_trigger=_int_option(lowered, OPTION_MAX_OFFSETS_PER_TRIGGER, 1),
        delays_ms=_topic_delays(lowered.get(OPTION_TOPIC_DELAYS_MS.lower()), topics),
        max_records_per_task=_int_option(lowered, OPTION_MAX_RECORDS_PER_TASK, 1)
        or DEFAULT_MAX_RECORDS_PER_TASK,
        client_options=client_options,
        secret_options=_secret_options(lowered.get(OPTION_SECRET_OPTIONS.lower())),
        emit_ranges=emit == "ranges",
        range_groups=_int_option(lowered, OPTION_RANGE_GROUPS, 1),
        available_now_offsets=_offsets_option(lowered, OPTION_AVAILABLE_NOW_OFFSETS, topics),
    )


def _secret_options(raw: str | None) -> tuple[str, ...]:
    """The names in option `retrylib.secretOptions` (a JSON list of strings; none if unset)."""
    if raw is None:
        return ()
    try:
        names = json.loads(raw)
    except ValueError:
        names = None
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise ValueError(f"option {OPTION_SECRET_OPTIONS} must be a JSON list of option names")
    return tuple(names)


def _offsets_option(options: Mapping[str, str], name: str, topics: list[str]) -> Offsets | None:
    """Offsets JSON of subscribed topics; raises `ValueError` naming the option and the fault."""
    raw = options.get(name.lower())
    if raw is None:
        return None
    try:
        parsed = json.loads(raw)
    except ValueError as e:
        raise ValueError(f"option {name}={raw!r} is not JSON: {e}") from e
    offsets = offsets_from_json(parsed, what=f"option {name}")
    unknown = sorted({topic for topic, _ in offsets} - set(topics))
    if unknown:
        raise ValueError(f"option {name} names topic(s) {unknown} that are not subscribed")
    return offsets


def _topic_delays(raw: str | None, topics: list[str]) -> dict[str, int]:
    """`retrylib.topicDelaysMs` parsed; raises `ValueError` naming the bad entry."""
    if raw is None:
        return {}
    try:
        delays = json.loads(raw)
    except ValueError:
        delays = None
    if not isinstance(delays, dict):
        raise ValueError(
            f"option {OPTION_TOPIC_DELAYS_MS}={raw!r} must be a JSON object of topic: delay ms"
        )
    for topic, delay in delays.items():
        if topic not in topics:
            raise ValueError(
                f"option {OPTION_TOPIC_DELAYS_MS} names {topic!r}, which is not subscribed"
            )
        if type(delay) is not int or delay < 0:
            raise ValueError(
                f"option {OPTION_TOPIC_DELAYS_MS}: the delay of {topic!r} must be an integer "
                f">= 0, got {delay!r}"
            )
    return delays


def _int_option(options: Mapping[str, str], name: str, minimum: int) -> int | None:
    raw = options.get(name.lower())
    if raw is None:
        return None
    try:
        value = int(str(raw).strip())
    except ValueError:
        value = minimum - 1
    if value < minimum:
        raise ValueError(f"option {name}={raw!r} must be an integer >= {minimum}")
    return value


class KafkaDataSource(DataSource):
    """The `retrylib_kafka` streaming data source (register it with `spark.dataSource`)."""

    @classmethod
    def name(cls) -> str:
        return "retrylib_kafka"

    def schema(self) -> StructType:
        """`KAFKA_SCHEMA`, or `RANGE_SCHEMA` with `retrylib.emit = ranges`; the options are
        checked here so that `load()` fails on bad ones."""
        return parse_source_options(self.options).schema

    def streamReader(self, schema: StructType) -> KafkaStreamReader:
        """The reader; raises `ValueError` for bad options or a schema other than `schema()`."""
        options = parse_source_options(self.options)
        if schema != options.schema:
            raise ValueError(
                f"the retrylib_kafka source has a fixed schema {options.schema.simpleString()}, "
                f"got {schema.simpleString()}"
            )
        return KafkaStreamReader(options)


@dataclass
class KafkaRangeGroup(InputPartition):
    """Offset ranges that one Spark task emits as rows (`retrylib.emit = ranges`)."""

    ranges: list[tuple[str, int, int, int]]  # topic, partition, start, end


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


class KafkaStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Plans offset ranges on the driver and reads them on the executors.

    Driver-side Kafka clients are created on first use and closed by `stop()`; a fresh reader
    (as Spark pickles to executors) holds none.
    """

    def __init__(self, options: SourceOptions) -> None:
        self._options = options
        self._metadata: _Metadata | None = None
        self._initial: Offsets | None = None
        self._last_end: Offsets | None = None
        self._target: Offsets | None = None

    @property
    def _kafka(self) -> _Metadata:
        if self._metadata is None:
            self._metadata = _Metadata(self._options)
        return self._metadata

    def initialOffset(self) -> dict:
        """Offsets of a new query: `startingOffsets`, and the earliest ones of delay tiers.

        Raises `TopicError` naming any subscribed topic that does not exist, `ValueError` when
        `startingOffsets` names a partition that does not exist.
        """
        return offsets_to_json(self._initial_offsets())

    def _initial_offsets(self) -> Offsets:
        """`initialOffset`'s answer, looked up once: Spark 4.0/4.1 ask for a new query's
        first end offsets before its initial ones, and both must start from the same place."""
        if self._initial is None:
            partitions = self._kafka.partitions()
            spec = self._options.starting_offsets
            tiers = {key: EARLIEST for key in partitions if key[0] in self._options.delays_ms}
            self._initial = resolve_starting_offsets(
                replace(spec, explicit={**tiers, **spec.explicit}),
                partitions,
                self._kafka.list_offsets(partitions, EARLIEST),
                self._kafka.list_offsets(partitions, LATEST),
            )
        return self._initial

    def latestOffset(self, start: dict | None = None, limit: ReadLimit | None = None) -> dict:
        """End offsets of the next batch starting at `start`, within `limit`.

        Every partition's end is its latest offset (or, for a delay tier, its first not-yet-due
        offset), never below `start`, held to the availableNow target if there is one, and
        cut to `limit` when it is a `ReadMaxRows`. Partitions missing from `start` (new
        partitions) start at their earliest offset.

        Spark 4.0/4.1 pass no arguments. The batch then starts where the last one ended (the
        end this reader returned or was handed last, else the initial offsets), is cut to
        `maxOffsetsPerTrigger`, and held to `retrylib.availableNowOffsets`: the same batches
        Spark 4.2 plans.
        """
        if start is None:
            begin = self._last_end if self._last_end is not None else self._initial_offsets()
            max_rows = self._options.max_offsets_per_trigger
            target = self._options.available_now_offsets
        else:
            begin = offsets_from_json(start, what="start offsets")
            max_rows = limit.max_rows if _is_max_rows(limit) else None
            target = self._target
        begin, end = self._available(begin)
        if target is not None:
            end = cap_at_target(begin, end, target)
        if max_rows is not None:
            end = limit_offsets(begin, end, max_rows)
        self._last_end = end
        return offsets_to_json(end)

    def getDefaultReadLimit(self) -> ReadLimit:
        """`ReadMaxRows(maxOffsetsPerTrigger)` when that option is set, else `ReadAllAvailable`."""
        if self._options.max_offsets_per_trigger is not None:
            return ReadMaxRows(self._options.max_offsets_per_trigger)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        """Take the target of an availableNow run: latest offsets now (or the delay frontier)."""
        self._target = self.available_end()
        log.info("availableNow target for %s: %s", self._options.topics, self._target)

    def available_end(self) -> Offsets:
        """What could be read now: every partition's latest offset, or for a delay tier its
        first not-yet-due one. Raises as `initialOffset`."""
        return self._available({})[1]

    def reportLatestOffset(self) -> dict:
        """The latest available offsets (no limit, no target), for the query's progress."""
        _, end = self._available(self._last_end or {})
        return offsets_to_json(end)

    def partitions(self, start: dict, end: dict) -> Sequence[KafkaInputPartition | KafkaRangeGroup]:
        """The input partitions of one batch: a range of at most `retrylib.maxRecordsPerTask`
        offsets each, only for topic-partitions with records between `start` and `end`;
        with `retrylib.emit = ranges` and `retrylib.rangeGroups`, those ranges in groups.

        Partitions missing from `start` (new partitions) are read from their earliest offset.
        `end` is where the next batch starts: Spark 4.0/4.1 pass no start to `latestOffset`,
        and on a restart hand the checkpoint's last offsets only here (as start and end).
        """
        begin = offsets_from_json(start, what="start offsets")
        finish = offsets_from_json(end, what="end offsets")
        self._last_end = finish
        new = [key for key in finish if key not in begin]
        if new:
            begin = with_new_partitions(begin, new, self._kafka.list_offsets(new, EARLIEST))
        ranges = split_ranges(begin, finish, self._options.max_records_per_task)
        if self._options.emit_ranges:
            groups = self._options.range_groups or max(len(ranges), 1)
            return [
                KafkaRangeGroup([(r.topic, r.partition, r.start, r.end) for r in group])
                for group in group_ranges(ranges, groups)
            ]
        return [
            KafkaInputPartition(
                r.topic,
                r.partition,
                r.start,
                r.end,
                self._options.bootstrap_servers,
                self._options.client_options,
                self._options.secret_options,
            )
            for r in ranges
        ]

    def read(  # type: ignore[override]
        self, partition: KafkaInputPartition | KafkaRangeGroup
    ) -> Iterator[pa.RecordBatch | tuple]:
        """Yield the records of `partition` as RecordBatches of `KAFKA_ARROW_SCHEMA`, or, with
        `retrylib.emit = ranges`, its ranges as rows of `RANGE_SCHEMA` without reading Kafka.

        Raises `KafkaSourceError` on a broker error or when no record arrives for
        `STALL_TIMEOUT_S` before the range is complete.
        """
        if isinstance(partition, KafkaRangeGroup):
            return iter(partition.ranges)
        return read_range(partition)

    def commit(self, end: dict) -> None:
        """Nothing to do: Spark checkpoints the offsets; nothing is committed to Kafka."""

    def stop(self) -> None:
        """Close the driver-side Kafka client."""
        metadata, self._metadata = self._metadata, None
        if metadata is not None:
            metadata.close()

    def _available(self, start: Offsets) -> tuple[Offsets, Offsets]:
        """`start` completed with new partitions at earliest, and the available end offsets."""
        partitions = self._kafka.partitions()
        new = [key for key in partitions if key not in start]
        if new:
            start = with_new_partitions(start, new, self._kafka.list_offsets(new, EARLIEST))
        end = self._kafka.list_offsets(partitions, LATEST)
        now_ms = int(time.time() * 1000)
        for delay_ms in set(self._options.delays_ms.values()):
            tier = [key for key in partitions if self._options.delays_ms.get(key[0]) == delay_ms]
            due = self._kafka.list_offsets(tier, now_ms - delay_ms)
            end.update(delay_frontier(due, {key: end[key] for key in tier}))
        return start, floor_at(end, start)


def _is_max_rows(limit: object) -> bool:
    return ReadMaxRows is not None and isinstance(limit, ReadMaxRows)


class _Metadata:
    """Driver-side Kafka look-ups: partitions of the subscribed topics, offsets by time."""

    def __init__(self, options: SourceOptions) -> None:
        self._topics = options.topics
        self._consumer = make_consumer(
            options.bootstrap_servers,
            options.client_options,
            secret_options=options.secret_options,
        )

    def partitions(self) -> list[PartitionKey]:
        """Every partition of the subscribed topics, from fresh metadata.

        Raises `TopicError` naming the subscribed topics that do not exist.
        """
        metadata = self._consumer.list_topics(timeout=METADATA_TIMEOUT_S)
        keys, missing = [], []
        for topic in self._topics:
            info = metadata.topics.get(topic)
            if info is None or info.error is not None or not info.partitions:
                missing.append(topic)
            else:
                keys.extend((topic, p) for p in sorted(info.partitions))
        if missing:
            raise TopicError(f"subscribed topic(s) {missing} do not exist")
        return keys

    def list_offsets(self, partitions: Sequence[PartitionKey], timestamp: int) -> Offsets:
        """`offsets_for_times` for `partitions`: `EARLIEST`, `LATEST` or epoch ms.

        For a time, the answer is the first offset at or after it, or -1 when there is none.
        A retriable error (a partition whose leader is still being elected, as right after
        partitions are added) is asked again until `METADATA_TIMEOUT_S` has passed. Raises
        `KafkaSourceError` naming the partition the broker answered with another error, or
        with a retriable one for that long.
        """
        offsets: Offsets = {}
        pending = list(partitions)
        deadline = time.monotonic() + METADATA_TIMEOUT_S
        while pending:
            answers = self._consumer.offsets_for_times(
                [TopicPartition(topic, p, timestamp) for topic, p in pending],
                timeout=METADATA_TIMEOUT_S,
            )
            pending = []
            for answer in answers:
                key = (answer.topic, answer.partition)
                if answer.error is None:
                    offsets[key] = answer.offset
                elif answer.error.retriable() and time.monotonic() < deadline:
                    pending.append(key)
                else:
                    raise KafkaSourceError(
                        redact(f"listing offsets of {key[0]}[{key[1]}] failed: {answer.error}")
                    )
            if pending:
                time.sleep(_RETRY_PAUSE_S)
        return offsets

    def close(self) -> None:
        self._consumer.close()


def read_range(part: KafkaInputPartition) -> Iterator[pa.RecordBatch]:
    """Yield `part`'s records as RecordBatches of `KAFKA_ARROW_SCHEMA`, at most `BATCH_ROWS`
    rows each. Fails as `read_messages` does."""
    pending: list[Message] = []
    for chunk in read_messages(part):
        pending.extend(chunk)
        while len(pending) >= BATCH_ROWS:
            yield to_batch(part, pending[:BATCH_ROWS])
            del pending[:BATCH_ROWS]
    if pending:
        yield to_batch(part, pending)


def read_messages(part: KafkaInputPartition) -> Iterator[list[Message]]:
    """Yield `part`'s records in offset order, as lists of at most `BATCH_ROWS` messages.

    Offsets inside the range that hold no record for this reader (transaction markers,
    records of aborted transactions under read_committed, compacted records) are skipped:
    the read ends at the first offset >= `part.end`, or when the partition's end (its high
    watermark, or last stable offset under read_committed) is at or past it. Raises
    `KafkaSourceError` naming the range on a message error, a stalled read, or records
    deleted from the broker (retention, delete-records) before they were read.
    """
    consumer = make_consumer(
        part.bootstrap_servers,
        {**part.client_options, **_READ_CLIENT_OPTIONS},
        secret_options=part.secret_options,
    )
    try:
        consumer.assign([TopicPartition(part.topic, part.partition, part.start)])
        yield from _message_chunks(consumer, part)
    finally:
        consumer.close()


def _message_chunks(consumer: Consumer, part: KafkaInputPartition) -> Iterator[list[Message]]:
    """The messages of `part`'s range in offset order, one list per `consume()` call.

    The consumer never resets its position (`auto.offset.reset` = error): it reaches an
    offset only by fetching the log up to it. So a partition end (EOF) at or past
    `part.end` proves that every offset before it was fetched, and the ones not delivered
    hold no committed record; the read may end there, short of `part.end` records.
    """
    next_offset = part.start
    delivered = 0
    deadline = time.monotonic() + STALL_TIMEOUT_S
    while next_offset < part.end:
        wanted = min(part.end - next_offset, BATCH_ROWS)
        chunk, finished = [], False
        for message in consumer.consume(num_messages=wanted, timeout=POLL_TIMEOUT_S):
            error = message.error()
            if error is not None and error.code() == KafkaError._AUTO_OFFSET_RESET:
                raise _offsets_gone(consumer, part, next_offset, error)
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
    skipped = part.end - part.start - delivered
    if skipped:
        log.debug(
            "%s: %d record(s), %d offset(s) without a record for this reader (transaction "
            "markers, aborted transactions, compaction)",
            _describe(part),
            delivered,
            skipped,
        )


def _offsets_gone(
    consumer: Consumer, part: KafkaInputPartition, next_offset: int, error: KafkaError
) -> KafkaSourceError:
    """The error for a fetch offset the broker no longer holds, with the log's bounds."""
    try:
        low, high = consumer.get_watermark_offsets(
            TopicPartition(part.topic, part.partition), timeout=METADATA_TIMEOUT_S, cached=False
        )
    except Exception as e:  # the error below still names the range and the offset
        return KafkaSourceError(
            f"reading {_describe(part)}: offset {next_offset} is out of range ({error}); "
            f"the partition's offsets could not be listed: {e}"
        )
    if low > next_offset:
        return KafkaSourceError(
            f"reading {_describe(part)}: records {part.topic}[{part.partition}]@{next_offset}.."
            f"{min(low, part.end) - 1} were deleted from Kafka before they were read (the "
            f"partition now starts at offset {low}: retention.ms, retention.bytes or "
            "delete-records); they cannot be processed, so the read fails rather than skip them"
        )
    return KafkaSourceError(
        f"reading {_describe(part)}: offset {next_offset} is outside the partition's offsets "
        f"{low}..{high} ({error}); was the topic deleted and re-created, or its log truncated?"
    )


def _describe(part: KafkaInputPartition) -> str:
    return f"{part.topic}[{part.partition}] offsets {part.start}..{part.end}"


def to_batch(part: KafkaInputPartition, messages: list[Message]) -> pa.RecordBatch:
    """`messages` of `part` as one RecordBatch of `KAFKA_ARROW_SCHEMA` (one pass over them)."""
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
        "topic": [part.topic] * len(messages),
        "partition": [part.partition] * len(messages),
        "offset": offsets,
        "timestamp": micros,
        "timestampType": kinds,
        "headers": headers,
    }
    return pa.RecordBatch.from_arrays(
        [pa.array(columns[f.name], type=f.type) for f in schema], schema=schema
    )
