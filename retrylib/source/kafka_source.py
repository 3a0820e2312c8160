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

This module is what Spark calls: the data source, and its stream reader, which plans a
batch's input partitions (offset ranges) on the driver and reads them in the tasks. What a
batch may read up to (the delay frontier, recreated topics, the breaker's hold) is
`end_offsets`; the driver's Kafka look-ups are `lookups`.
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.types import StructType

from retrylib.kafka.offsets import (
    EARLIEST,
    LATEST,
    OffsetRange,
    Offsets,
    cap_at_target,
    deal,
    group_ranges,
    limit_offsets,
    offsets_from_json,
    offsets_to_json,
    range_length,
    resolve_starting_offsets,
    split_ranges,
    with_new_partitions,
)
from retrylib.logs import configure_worker_logging
from retrylib.retry.key_order import queues_to_json, read_queues
from retrylib.source.end_offsets import EndOffsets
from retrylib.source.key_groups import key_groups
from retrylib.source.lookups import KafkaLookups
from retrylib.source.options import SourceOptions, parse_source_options
from retrylib.source.range_reader import KafkaInputPartition, read_range

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
        self._metadata: KafkaLookups | None = None
        self._initial: Offsets | None = None
        self._last_end: Offsets | None = None
        self._target: Offsets | None = None
        self._ends = EndOffsets(options)

    @property
    def _kafka(self) -> KafkaLookups:
        if self._metadata is None:
            self._metadata = KafkaLookups(self._options)
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
        keep their offsets (`EndOffsets.available`).

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
        begin, end = self._ends.available(self._kafka, begin)
        if target is not None:
            end = cap_at_target(begin, end, target)
        if self._options.breaker_file is not None:
            end = self._ends.held_by_breaker(begin, end)
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
        return self._ends.available(self._kafka, {})[1]

    def reportLatestOffset(self) -> dict:
        """The latest available offsets (no limit, no target), for the query's progress."""
        _, end = self._ends.available(self._kafka, self._last_end or {})
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
        lost = self._ends.take_lost()
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
        kept = self._ends.not_read(finish)
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


def _records(numbered_group: tuple[int, list[OffsetRange]]) -> int:
    return sum(range_length(r) for r in numbered_group[1])


def _is_max_rows(limit: object) -> bool:
    return ReadMaxRows is not None and isinstance(limit, ReadMaxRows)
