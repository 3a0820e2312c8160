"""Kafka as a Spark Structured Streaming source, written as a Python Data Source.

`spark.readStream.format("retrylib_kafka")` reads Kafka through confluent-kafka and emits
exactly the schema of Spark's built-in `kafka` source, with the same option names
(`kafka.bootstrap.servers`, `subscribe`, `startingOffsets`, `maxOffsetsPerTrigger`,
`kafka.*` pass-through), so a job can switch between the two formats.

Options of its own:

- `retrylib.emit`: `records` (the default, the built-in schema) or `ranges`: one row per
  offset range (`RANGE_SCHEMA`) and no records. The retrylib job reads the ranges itself in
  the task that routes them (`range_reader.read_messages`), so records never pass through the JVM.
  With `retrylib.rangeGroups = N` a batch's ranges come in at most N input partitions,
  balanced by record count: Spark pays a Python worker round trip per input partition.
- `retrylib.topicDelaysMs`: a JSON object naming subscribed topics that are fixed-delay
  retry tiers, with their delays: `{"orders.retry.5s": 5000}`. The source is a delay
  frontier for them: a partition's end offset is the first record whose Kafka timestamp
  is after `now - delay` (found with `offsets_for_times`, no scanning), so records become
  visible once due and batches run as time passes, with no new data needed. With
  `retrylib.readAheadMs`, records due up to that long from now are read too (the job's
  task waits until each is due: `retry.read_ahead`). A short
  not-yet-due tail that holds only transaction markers is read with the records before it
  (`offsets.marker_tails`): a marker alone never makes a batch. A new query
  reads a tier from its earliest offset, whatever `startingOffsets` says (a tier holds
  retries still owed), so one source serves the main topics and every tier. A topic taken
  out of `subscribe` keeps its offsets in the checkpoint: subscribed again (a retry tier
  removed from the config and added back), it is read on from where it was.
  The index answers with the first record stamped at or after a time, so one record
  stamped ahead of the clock would hide every record behind it until its time: where the
  frontier is such a record, the records from there are read for their timestamps instead
  (`offsets.FrontierScan`), the odd one is read at once and named in a WARN.
- `retrylib.tierStampsAhead`: `true` (the default) when the job's own producers stamp a
  tier's records up to one delay ahead of their clock (`policy.tier_timestamp_ms`), `false`
  for topics whose fair records are stamped no later than now (a delay router's); a record
  stamped further ahead (`policy.latest_fair_timestamp_ms`) is one so passed over.
- `retrylib.maxRecordsPerTask`: the longest offset range one Spark task reads (250000).
- `retrylib.availableNowOffsets`: offsets JSON (`{"topic": {"0": 12}}`) the source reads up
  to and no further, for an availableNow run on Spark 4.0/4.1 (see below).
- `retrylib.breakerFile`: a local file with the job's breaker state (`retrylib.retry.breaker`):
  while it is open, the main topics are held at the batch's start, but for its probes.
- `retrylib.keyOrder`: ranges are grouped so that a key's records are read by one task
  (`key_groups`); a group's first row carries its keys' queues, read from a local file the
  job keeps (`retrylib.retry.key_order`).

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

import json
import logging
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace

import pyarrow as pa
from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.types import StructType

from retrylib.config.durations import format_duration
from retrylib.errors import KafkaSourceError, TopicError
from retrylib.kafka.clients import make_consumer, topic_partitions
from retrylib.kafka.offsets import (
    EARLIEST,
    LATEST,
    FrontierScan,
    OffsetRange,
    Offsets,
    PartitionKey,
    cap_at_target,
    deal,
    delay_frontier,
    floor_at,
    group_ranges,
    hidden_frontiers,
    limit_offsets,
    marker_tails,
    not_read,
    offsets_from_json,
    offsets_to_json,
    past_markers,
    range_length,
    recreated_topics,
    resolve_starting_offsets,
    split_ranges,
    with_new_partitions,
)
from retrylib.kafka.reading import Reading, ReadToEnd, reading_options
from retrylib.logs import OnceAMinute, configure_worker_logging, redact
from retrylib.retry.breaker import main_topic_allowance, read_state
from retrylib.retry.key_order import queues_to_json, read_queues
from retrylib.retry.policy import due_timestamp_ms, latest_fair_timestamp_ms
from retrylib.source.key_groups import key_groups
from retrylib.source.options import SourceOptions, parse_source_options
from retrylib.source.range_reader import METADATA_TIMEOUT_S, KafkaInputPartition, read_range

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

_RETRY_PAUSE_S = 0.2  # between asks for offsets the broker could not give yet
_TAIL_READ_S = 2.0
"""How long the driver reads delay tiers' short not-yet-due tails for records (`_past_markers`):
one fetch of a few offsets from each, which a broker answers in milliseconds; and at most
how long it reads timestamps behind a record stamped ahead (`_past_stamped_ahead`)."""
_SCAN_RECORDS = 100_000
"""The most records read for their timestamps at one look (`_past_stamped_ahead`); the rest
are read at the next. Each is read there once, as it falls due."""
_STAMPED_AHEAD_LOG = logging.getLogger(__name__ + ".stamped_ahead")
_STAMPED_AHEAD_LOG.addFilter(OnceAMinute())


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
        quiet_hang_up()
        options = parse_source_options(self.options)
        if schema != options.schema:
            raise ValueError(
                f"the retrylib_kafka source has a fixed schema {options.schema.simpleString()}, "
                f"got {schema.simpleString()}"
            )
        return KafkaStreamReader(options)


# The module Spark runs (python -m) to plan a Python stream source's batches.
_SOURCE_RUNNER = "pyspark.sql.streaming.python_streaming_source_runner"
# What that runner dies of when the JVM closes its connection while it answers.
_HUNG_UP = (BrokenPipeError, ConnectionResetError, EOFError)


def quiet_hang_up() -> None:
    """In Spark's stream-source runner process only: end without a traceback when the JVM
    hangs up on it. A query stopped while the runner answers (the next trigger's offsets,
    asked right after the last batch) closes its socket under it; the runner then dies of a
    BrokenPipeError whose traceback Python prints into the job's log, after the stop's own
    line. That end is the stop's, not an error."""
    main = sys.modules.get("__main__")
    if getattr(getattr(main, "__spec__", None), "name", None) != _SOURCE_RUNNER:
        return
    previous = sys.excepthook

    def hook(kind: type[BaseException], value: BaseException, trace: object) -> None:
        if not issubclass(kind, _HUNG_UP):
            previous(kind, value, trace)  # type: ignore[arg-type]

    sys.excepthook = hook


@dataclass
class KafkaRangeGroup(InputPartition):
    """Offset ranges that one Spark task emits as rows (`retrylib.emit = ranges`)."""

    # topic, partition, start, end, records lost or None (and, with keyOrder, queues or None)
    ranges: list[tuple]


def with_records_lost(
    planned: list[KafkaRangeGroup], end: Offsets, lost: int, *, key_order: bool
) -> list[KafkaRangeGroup]:
    """`planned` with `lost` (records deleted topics took, > 0) on an empty range at the end
    of its first group, or in a group of its own when there is none; as planned when nothing
    was lost, or when there is no partition to name. With `key_order`, rows carry queues."""
    if not lost or not end:
        return planned
    key = min(end)
    row: tuple = (*key, end[key], end[key], lost, *((None,) if key_order else ()))
    if not planned:
        return [KafkaRangeGroup([row])]
    return [KafkaRangeGroup([*planned[0].ranges, row]), *planned[1:]]


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
        self._tails_with_records: dict[PartitionKey, tuple[int, int]] = {}
        # Every partition's latest offset at the last look, to count what a deleted topic took.
        self._latest_seen: Offsets = {}
        # Records deleted topics took unread since the last batch planned, for the next one.
        self._records_lost = 0
        # The first not-due record (offset, timestamp) each scan found (`FrontierScan`).
        self._not_due: dict[PartitionKey, tuple[int, int]] = {}

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
            at_timestamp = None
            if spec.timestamp_ms is not None:
                main = [key for key in partitions if key not in tiers]
                at_timestamp = self._kafka.list_offsets(main, spec.timestamp_ms)
            self._initial = resolve_starting_offsets(
                replace(spec, explicit={**tiers, **spec.explicit}),
                partitions,
                self._kafka.list_offsets(partitions, EARLIEST),
                self._kafka.list_offsets(partitions, LATEST),
                at_timestamp,
            )
        return self._initial

    def latestOffset(self, start: dict | None = None, limit: ReadLimit | None = None) -> dict:
        """End offsets of the next batch starting at `start`, within `limit`.

        Every partition's end is its latest offset (or, for a delay tier, its first not-yet-due
        offset), never below `start`, held to the availableNow target if there is one, and
        cut to `limit` when it is a `ReadMaxRows`. Partitions missing from `start` (new
        partitions) start at their earliest offset; topics in `start` no longer subscribed
        keep their offsets (`_available`).

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
        if self._options.breaker_file is not None:
            end = self._held_by_breaker(begin, end)
        if max_rows is not None:
            end = limit_offsets(begin, end, max_rows)
        self._last_end = end
        return offsets_to_json(end)

    def _held_by_breaker(self, begin: Offsets, end: Offsets) -> Offsets:
        """`end` with the main topics held at `begin` while the breaker is open, or cut to
        its probe's records when one is due, and every partition held at `begin` while the
        job is paused (`retrylib.retry.breaker`)."""
        assert self._options.breaker_file is not None
        state = read_state(self._options.breaker_file)
        if state.paused:  # everything waits where it is: the downstream is down
            return {key: begin.get(key, offset) for key, offset in end.items()}
        allowance = main_topic_allowance(state, int(time.time() * 1000))
        if allowance is None:
            return end
        main = {key: offset for key, offset in end.items() if key[0] not in self._options.delays_ms}
        held = {key: begin[key] for key in main}
        if allowance > 0:
            held = limit_offsets(held, main, allowance)
        return {**end, **held}

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

        Partitions missing from `start` (new partitions), and those whose start is past their
        end (of a topic created again), are read from their earliest offset. `end` is where
        the next batch starts: Spark 4.0/4.1 pass no start to `latestOffset`, and on a
        restart hand the checkpoint's last offsets only here (as start and end).
        """
        begin = offsets_from_json(start, what="start offsets")
        finish = offsets_from_json(end, what="end offsets")
        self._last_end = finish
        lost, self._records_lost = self._records_lost, 0
        # A start past its end is of a topic created again since (`_without_recreated`).
        new = [key for key in finish if key not in begin or begin[key] > finish[key]]
        if new:
            kept = {key: offset for key, offset in begin.items() if key not in new}
            begin = with_new_partitions(kept, new, self._kafka.list_offsets(new, EARLIEST))
        ranges = split_ranges(begin, finish, self._options.max_records_per_task)
        if self._options.key_order is not None:
            planned = self._key_group_partitions(ranges, finish)
            return with_records_lost(planned, finish, lost, key_order=True)
        if self._options.emit_ranges:
            groups = self._options.range_groups or max(len(ranges), 1)
            planned = [
                KafkaRangeGroup([(r.topic, r.partition, r.start, r.end, None) for r in group])
                for group in group_ranges(ranges, groups)
            ]
            return with_records_lost(planned, finish, lost, key_order=False)
        return [
            KafkaInputPartition(
                r.topic,
                r.partition,
                r.start,
                r.end,
                self._options.bootstrap_servers,
                self._options.client_options,
                self._options.secret_options,
                self._options.fail_on_data_loss,
            )
            for r in ranges
        ]

    def _key_group_partitions(
        self, ranges: list[OffsetRange], finish: Offsets
    ) -> list[KafkaRangeGroup]:
        """`ranges` in key groups dealt over `retrylib.rangeGroups` partitions, each group's
        first row carrying the queues of its keys."""
        key_order = self._options.key_order
        assert key_order is not None
        kept = self._not_read(finish)
        read = [key for key in finish if key not in kept]
        groups, group_of = key_groups(ranges, key_order.tiers, read)
        entries: list[list] = [[] for _ in groups]
        for key, queue in read_queues(key_order.state_file).items():
            index = group_of.get(key[:2])
            if index is not None:  # else none of its key's records is read in this batch
                entries[index].append((key, queue))
        first_rows = [
            json.dumps(queues_to_json(queues)).encode() if queues else None for queues in entries
        ]
        numbered = list(enumerate(groups))
        bins = deal(numbered, self._options.range_groups or max(len(groups), 1), _records)
        return [
            KafkaRangeGroup(
                [
                    (r.topic, r.partition, r.start, r.end, None, None if i else first_rows[index])
                    for index, group in dealt
                    for i, r in enumerate(group)
                ]
            )
            for dealt in bins
        ]

    def read(  # type: ignore[override]
        self, partition: KafkaInputPartition | KafkaRangeGroup
    ) -> Iterator[pa.RecordBatch | tuple]:
        """Yield the records of `partition` as RecordBatches of `KAFKA_ARROW_SCHEMA`, or, with
        `retrylib.emit = ranges`, its ranges as rows of `RANGE_SCHEMA` without reading Kafka.

        Raises `KafkaSourceError` on a broker error or when no record arrives for
        `STALL_TIMEOUT_S` before the range is complete. The consumer is the Python worker's,
        kept for its next reads (`range_reader.read_messages`).
        """
        if isinstance(partition, KafkaRangeGroup):
            return iter(partition.ranges)
        configure_worker_logging()
        return read_range(partition)

    def commit(self, end: dict) -> None:
        """Nothing to do: Spark checkpoints the offsets; nothing is committed to Kafka."""

    def stop(self) -> None:
        """Close the driver-side Kafka client."""
        metadata, self._metadata = self._metadata, None
        if metadata is not None:
            metadata.close()

    def _available(self, start: Offsets) -> tuple[Offsets, Offsets]:
        """`start` completed with new partitions at earliest, and the available end offsets.

        The end keeps the start of every topic the source no longer subscribes to (a retry
        tier or a main topic taken out of the config): subscribed again, the topic is read on
        from there, not from its earliest record again.

        A look that finds a listed topic unknown to the broker (deleted meanwhile, and maybe
        being created again) is started over from fresh metadata until `METADATA_TIMEOUT_S`
        has passed. What it counted lost is counted once: the next try compares with the
        offsets this one saw.
        """
        deadline = time.monotonic() + METADATA_TIMEOUT_S
        while True:
            try:
                return self._look(start)
            except TopicVanished:
                if time.monotonic() >= deadline:
                    raise
                time.sleep(_RETRY_PAUSE_S)

    def _look(self, start: Offsets) -> tuple[Offsets, Offsets]:
        """One try of `_available`."""
        partitions = self._kafka.partitions()
        end = self._kafka.list_offsets(partitions, LATEST)
        start = self._without_recreated(start, end)
        self._count_gone(start, end)
        self._latest_seen = dict(end)
        new = [key for key in partitions if key not in start]
        if new:
            start = with_new_partitions(start, new, self._kafka.list_offsets(new, EARLIEST))
        now_ms = int(time.time() * 1000)
        due_by_ms = now_ms + self._options.read_ahead_ms
        for delay_ms in set(self._options.delays_ms.values()):
            tier = [key for key in partitions if self._options.delays_ms.get(key[0]) == delay_ms]
            due_before_ms = due_timestamp_ms(due_by_ms, delay_ms)
            latest = {key: end[key] for key in tier}
            frontier = delay_frontier(self._kafka.list_offsets(tier, due_before_ms), latest)
            fair_until_ms = latest_fair_timestamp_ms(
                now_ms, delay_ms, self._options.tier_stamps_ahead
            )
            scan = FrontierScan(due_before_ms, fair_until_ms)
            frontier = self._past_stamped_ahead(frontier, start, latest, scan, now_ms)
            end.update(self._past_markers(frontier, latest))
        return start, {**self._not_read(start), **floor_at(end, start)}

    def _without_recreated(self, start: Offsets, latest: Offsets) -> Offsets:
        """`start` without the topics that were deleted and created again since
        (`recreated_topics`: `latest` is behind it, or behind what this reader saw), which are
        then read from their earliest offsets.

        Raises `TopicError` naming them and what changed, unless `failOnDataLoss` is false:
        then a warning says so, and the next batch counts them in `records_lost`. Both count
        the records this reader last saw waiting there (they went with the old topic), when
        it saw the topic before.
        """
        recreated = recreated_topics(start, latest, self._latest_seen)
        if not recreated:
            return start
        changes = "; ".join(f"{topic!r}: {', '.join(what)}" for topic, what in recreated.items())
        waited = self._waited([key for key in start if key[0] in recreated], start)
        if waited is not None:
            lost = f"the {waited} record(s) that waited there unread are lost"
        else:
            lost = "the records that waited there unread are lost"
        if self._options.fail_on_data_loss:
            raise TopicError(
                f"topic(s) deleted and created again since the job read them ({changes}): "
                f"{lost}. To read them on from their start, set kafka.fail_on_data_loss = "
                "false for one run"
            )
        log.warning(
            "topic(s) deleted and created again since the job read them (%s): %s; reading "
            "them from their start (failOnDataLoss is false)",
            changes,
            lost,
        )
        self._records_lost += waited or 0
        return {key: offset for key, offset in start.items() if key[0] not in recreated}

    def _count_gone(self, start: Offsets, latest: Offsets) -> None:
        """Count, for the next batch's `records_lost`, the records this reader last saw
        waiting unread in subscribed topics that are gone now (deleted; with `failOnDataLoss`
        false, `_Metadata.partitions` leaves them out), with a warning naming them."""
        present = {topic for topic, _ in latest}
        unsubscribed = self._not_read(start)
        gone = [key for key in start if key[0] not in present and key not in unsubscribed]
        waited = self._waited(gone, start)
        if waited:
            topics = sorted({topic for topic, _ in gone})
            log.warning(
                "topic(s) %s deleted: the %d record(s) that waited there unread are lost",
                topics,
                waited,
            )
            self._records_lost += waited

    def _waited(self, keys: Sequence[PartitionKey], start: Offsets) -> int | None:
        """The records between `start` and the latest offset this reader last saw, over those
        of `keys` it saw (None: it saw none of them)."""
        seen = [key for key in keys if key in self._latest_seen]
        if not seen:
            return None
        return sum(max(self._latest_seen[key] - start[key], 0) for key in seen)

    def _not_read(self, offsets: Offsets) -> Offsets:
        """The entries of `offsets` of topics this source no longer subscribes to."""
        return not_read(offsets, self._options.topics, self._options.topic_pattern)

    def _past_stamped_ahead(
        self,
        frontier: Offsets,
        start: Offsets,
        latest: Offsets,
        scan: FrontierScan,
        now_ms: int,
    ) -> Offsets:
        """`frontier` of a delay tier with the frontiers the time index hides behind a record
        stamped ahead of the clock found by reading timestamps (`hidden_frontiers`); each such
        record is named in a WARN (one a minute per partition) and read now.

        Asks the index once more (for the latest fair timestamp) about the partitions with
        a not-yet-due tail; reads only the hidden ones, from their frontier, at most
        `_SCAN_RECORDS` records for `_TAIL_READ_S`, and none whose frontier an earlier read
        found and is not due yet. (A transaction's commit marker that `_past_markers` passed
        is such a hidden frontier too, until its time: one fetch finds the record after it
        not due, and that is kept.)
        """
        waiting = [key for key, offset in frontier.items() if start[key] <= offset < latest[key]]
        first_ahead = self._kafka.list_offsets(waiting, scan.fair_until_ms + 1) if waiting else {}
        hidden = hidden_frontiers(frontier, start, latest, first_ahead)
        if not hidden:
            return frontier
        known = scan.known(hidden, self._not_due)
        unread: dict[PartitionKey, int] | None = {}
        if len(known) < len(hidden):
            to_read = {key: begin for key, begin in hidden.items() if key not in known}
            unread = self._kafka.scan_timestamps(to_read, latest, scan)
        if unread is None:
            return frontier
        self._not_due.update(scan.not_due)
        for (topic, partition), offset, timestamp_ms in scan.stamped_ahead:
            _STAMPED_AHEAD_LOG.warning(
                "%s: the record at offset %d has a Kafka timestamp %s ahead of this clock: "
                "its producer's clock is off. It is read now and judged by its headers, and "
                "the records behind it are read as they fall due",
                f"{topic}[{partition}]",
                offset,
                format_duration((timestamp_ms - now_ms) // 1000 * 1000),
            )
        return {**frontier, **scan.moved(hidden, latest, unread)}

    def _past_markers(self, frontier: Offsets, latest: Offsets) -> Offsets:
        """`frontier` of a delay tier moved past its not-yet-due tails that hold only
        transaction markers (`marker_tails`), so that no batch runs for the markers alone;
        a tail found to hold records is remembered and not looked at again."""
        tails = marker_tails(frontier, latest, self._tails_with_records)
        if not tails:
            return frontier
        holding = self._kafka.holding_records(tails)
        self._tails_with_records.update({key: tails[key] for key in holding})
        return past_markers(frontier, latest, (key for key in tails if key not in holding))


# Answers to an offset look-up that pass once the cluster settles: a partition's leader
# being elected or moved (as right after partitions are added), a slow broker. confluent-kafka
# marks none of them retriable on the errors offsets_for_times gives.
_PASSING_CODES = frozenset(
    {
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError.UNKNOWN_LEADER_EPOCH,
        KafkaError.FENCED_LEADER_EPOCH,
        KafkaError.OFFSET_NOT_AVAILABLE,
        KafkaError.REQUEST_TIMED_OUT,
        KafkaError._TIMED_OUT,
        KafkaError._TRANSPORT,
    }
)


def _records(numbered_group: tuple[int, list[OffsetRange]]) -> int:
    return sum(range_length(r) for r in numbered_group[1])


class TopicVanished(KafkaSourceError):
    """The broker does not know a partition its metadata listed a moment before: the topic
    was deleted meanwhile (and may be being created again)."""


def _vanished(partitions: Sequence[PartitionKey]) -> str:
    topics = sorted({topic for topic, _ in partitions})
    return f"listing offsets of {topics} failed: the broker no longer knows them (deleted?)"


def _passing(error: KafkaError) -> bool:
    return error.retriable() or error.code() in _PASSING_CODES


def _is_max_rows(limit: object) -> bool:
    return ReadMaxRows is not None and isinstance(limit, ReadMaxRows)


class _Metadata:
    """Driver-side Kafka look-ups: partitions of the subscribed topics, offsets by time."""

    def __init__(self, options: SourceOptions) -> None:
        self._options = options
        self._missing: list[str] = []  # subscribed topics found missing at the last look
        self._consumer = make_consumer(
            options.bootstrap_servers,
            options.client_options,
            secret_options=options.secret_options,
        )
        self._tail_reader: Consumer | None = None

    def partitions(self) -> list[PartitionKey]:
        """Every partition of the subscribed topics, and of the topics matching
        `subscribePattern` now, from fresh metadata.

        Raises `TopicError` naming the subscribed topics that do not exist, unless
        `failOnDataLoss` is false: then they are left out, with a warning each time the set
        of missing topics changes (a topic created again is read from its earliest offset).
        """
        topics = self._options.topics
        found = topic_partitions(
            self._consumer, topics, METADATA_TIMEOUT_S, self._options.topic_pattern
        )
        missing = [topic for topic in topics if topic not in found]
        if missing and self._options.fail_on_data_loss:
            raise TopicError(
                f"subscribed topic(s) {missing} do not exist (deleted?); create them, or set "
                "kafka.fail_on_data_loss = false to read the other topics without them"
            )
        if missing != self._missing:
            self._missing = missing
            if missing:
                log.warning(
                    "subscribed topic(s) %s do not exist (deleted?): reading the others "
                    "(failOnDataLoss is false); records they held and were not read are lost",
                    missing,
                )
        return [(topic, p) for topic, partitions in found.items() for p in partitions]

    def list_offsets(self, partitions: Sequence[PartitionKey], timestamp: int) -> Offsets:
        """`offsets_for_times` for `partitions`: `EARLIEST`, `LATEST` or epoch ms.

        For a time, the answer is the first offset at or after it, or -1 when there is none.
        A retriable error, for one partition or the whole request (a partition whose leader
        is still being elected, as right after partitions are added), is asked again until
        `METADATA_TIMEOUT_S` has passed. Raises `TopicVanished` when the broker does not know
        a partition (its topic was deleted since the metadata listed it), `KafkaSourceError`
        naming the partition the broker answered with another error, or with a retriable one
        for that long, and `KafkaException` when the request itself fails so.
        """
        offsets: Offsets = {}
        pending = list(partitions)
        deadline = time.monotonic() + METADATA_TIMEOUT_S
        while pending:
            try:
                answers = self._consumer.offsets_for_times(
                    [TopicPartition(topic, p, timestamp) for topic, p in pending],
                    timeout=METADATA_TIMEOUT_S,
                )
            except KafkaException as e:
                if e.args[0].code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
                    raise TopicVanished(_vanished(pending)) from e
                if not (_passing(e.args[0]) and time.monotonic() < deadline):
                    raise
                time.sleep(_RETRY_PAUSE_S)
                continue
            pending = []
            for answer in answers:
                key = (answer.topic, answer.partition)
                if answer.error is None:
                    offsets[key] = answer.offset
                elif answer.error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
                    raise TopicVanished(_vanished([key]))
                elif _passing(answer.error) and time.monotonic() < deadline:
                    pending.append(key)
                else:
                    raise KafkaSourceError(
                        redact(f"listing offsets of {key[0]}[{key[1]}] failed: {answer.error}")
                    )
            if pending:
                time.sleep(_RETRY_PAUSE_S)
        return offsets

    def holding_records(self, tails: Mapping[PartitionKey, tuple[int, int]]) -> set[PartitionKey]:
        """The partitions of `tails` ((start, end) offsets of each) that hold a committed
        record in that range, or may: not read to its end within `_TAIL_READ_S`, ended before
        it (an open transaction, or a topic deleted and created again since its end was
        listed: the next look at it tells), or not read at all because Kafka answered with an
        error (logged)."""
        read = ReadToEnd(
            self._tail_consumer(),
            {key: start for key, (start, _) in tails.items()},
            {key: end for key, (_, end) in tails.items()},
        )
        try:
            holding = {(m.topic(), m.partition()) for m in read.messages(_TAIL_READ_S)}
        except KafkaException as error:
            log.info("reading the tails of %s failed, read as holding records: %s", tails, error)
            return set(tails)
        return holding | set(read.unfinished) | read.ended_short

    def scan_timestamps(
        self,
        begin: Mapping[PartitionKey, int],
        latest: Mapping[PartitionKey, int],
        scan: FrontierScan,
    ) -> dict[PartitionKey, int] | None:
        """Show `scan` the committed records of each partition from `begin` until its frontier
        is found or `latest` is reached, for at most `_SCAN_RECORDS` records and
        `_TAIL_READ_S`; returns the next offset of each partition it did not read to its end,
        or None when Kafka answered with an error (logged)."""
        read = ReadToEnd(self._tail_consumer(), dict(begin), {key: latest[key] for key in begin})
        try:
            for message in read.messages(_TAIL_READ_S, limit=_SCAN_RECORDS):
                key = (message.topic(), message.partition())
                scan.see(key, message.offset(), message.timestamp()[1])
                if begin.keys() <= scan.not_due.keys():
                    break
        except KafkaException as error:
            log.info("reading the timestamps of %s failed, read later: %s", begin, error)
            return None
        return read.unfinished

    def _tail_consumer(self) -> Consumer:
        """The read_committed consumer of the tails and scans, made on first use."""
        if self._tail_reader is None:
            self._tail_reader = make_consumer(
                self._options.bootstrap_servers,
                reading_options(self._options.client_options, Reading.TO_END),
                secret_options=self._options.secret_options,
            )
        return self._tail_reader

    def close(self) -> None:
        self._consumer.close()
        if self._tail_reader is not None:
            self._tail_reader.close()
