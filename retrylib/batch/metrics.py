"""Per-batch metrics: one JSON log line per micro-batch, and an optional Delta table.

`MetricsRecorder.on_result` runs at the end of every batch (it is the batch commit's `on_result`
callback, so it runs inside `foreachBatch`, on the driver, wherever the batch runs). It logs
one line on the `retrylib.metrics` logger whose message is a JSON object:

    {"job": "orders", "batch_id": 7, "replayed": false, "finished_at": "2026-...Z",
     "duration_ms": 812, "records_main": 100, "records_retry": 4, "succeeded": 97,
     "main_failed": 3, "output_rows": 97, "dead_lettered": 2,
     "dead_lettered_too_large": 0, "dead_letter_truncated": 0, "duplicates_skipped": 0,
     "requeued_not_due": 0, "skipped_other_job": 0, "skipped_by_handler": 0,
     "held_behind_key": 0, "records_lost": 0, "reserved_headers_removed": 0, "hook_errors": 0,
     "records_delayed": 0, "forwarded": 0, "forwarded_to_fallback": 0, "unroutable": 0,
     "timestamp_header_missing": 0, "handler_ms": 40, "kafka_clients_opened": 0,
     "retried": 5, "retried_by_tier": [4, 1], "produced": 7,
     "lateness_p50_ms_by_tier": [212, null], "lateness_p99_ms_by_tier": [870, null],
     "oldest_waiting_ms_by_tier": [4100, 61000], "breaker": null, "paused_ms": null,
     "dead_letters_waiting": 12, "oldest_dead_letter_age_ms": 5400000,
     "input_lag": {"orders": {"lag": 0, "not_due": 0},
                   "orders.orders.retry.5s": {"lag": 0, "not_due": 3}}}

and, when `[metrics] table` is set, appends the same figures as one row to that Delta table
(`METRICS_SCHEMA`; `input_lag` there is a list of (topic, lag, not_due) structs). The
append carries the app transaction (`<app id>:metrics`, batch id), so a replayed batch
never adds a second row. A metrics table made before a column was added to
`METRICS_SCHEMA` gains it on the next append.

`dead_lettered_too_large` counts the records dead-lettered because their retry copy is
over what its tier topic accepts (included in `dead_lettered`); `dead_letter_truncated`
the records produced to the dead-letter topic cut to fit it (`record_size.fit`).

`lateness_p50_ms_by_tier` and `lateness_p99_ms_by_tier` are percentiles, per retry tier, of
how long after it was due each retry record of the batch reached the handler (null: none
did). `oldest_waiting_ms_by_tier` is the age of the longest-waiting record at the head of
each tier's partitions after the batch, since it failed (null: nothing waits). `breaker` is
the breaker's state after the batch (`open`, `closed`, `paused`; null without `[breaker]`),
`paused_ms` how long `[breaker] health` held the job paused since the last batch's metrics
(null without `[breaker]`). `dead_letters_waiting` counts the dead-letter table's records no
redrive has sent back, `oldest_dead_letter_age_ms` is the age of the oldest of them (null:
none waits); the table is read on the first batch and then at most every
`metrics.dead_letter_every` (a Spark query), so both may be that old (null for a delay
router, or when the read failed). The same
counters and percentiles are in Spark's progress reports too (`observed`).

Input lag is measured right after the batch: for a main topic, records in Kafka past the
batch's end offsets (read from the Spark checkpoint's offset log); for a retry tier topic,
`lag` counts records past the end that are already due and `not_due` those still waiting
out their delay. Counts are offset distances, so transaction markers (one per partition per
produced batch on retry topics) count too: an upper bound, off by a few per batch.

Metrics never fail a batch: a failed lag look-up leaves `input_lag` and
`oldest_waiting_ms_by_tier` null, a failed table
append is logged as a warning and that batch's row is missing.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from retrylib.batch.at_once import Started
from retrylib.batch.result import BatchResult
from retrylib.config.model import AnyConfig, RetryTier
from retrylib.config.table_ref import TableRef
from retrylib.kafka.offsets import PartitionKey, delay_frontier
from retrylib.kafka.reading import KafkaOffsets, ReadToEnd, reading_consumer
from retrylib.logs import METRICS_LOGGER
from retrylib.retry.headers import LAST_FAILURE, header_ms, split_headers
from retrylib.retry.outcomes import Count, ForwardCount, retried, retried_tier
from retrylib.retry.policy import due_timestamp_ms
from retrylib.sinks.dead_letter_table import DeadLetterTable
from retrylib.sinks.tables import append_once, ensure_table
from retrylib.state.checkpoint import Checkpoint

if TYPE_CHECKING:
    from retrylib.retry.breaker import Breaker


log = logging.getLogger(METRICS_LOGGER)  # the batch lines and the warnings

_TIMESTAMP = pa.timestamp("us", tz="UTC")
_REPORTED_COUNTS = (
    *(count for count in Count if count not in (Count.KAFKA_READ_MS, Count.RETRIED)),
    *ForwardCount,
)
"""The tasks' counters the metrics carry: every one but `kafka_read_ms`, which only the
batch's own log line shows (docs/operating.md), and `retried`, which no task keeps. A handler
job's and a delay router's rows have the same columns, so one table or dashboard can hold
both."""
OBSERVED_COUNTERS = (*_REPORTED_COUNTS, Count.RETRIED)
"""The counters the routing tasks count (`observed`): theirs, and `retried`, the tiers'
`retried_tier_N` summed."""
_COUNTERS = (*OBSERVED_COUNTERS, "produced")
"""Every counter of the metrics: the observed ones, and the records the batch produced to
tiers and dead-letter topics (known on the driver only)."""
METRICS_SCHEMA = pa.schema(
    [
        pa.field("job", pa.string()),
        pa.field("batch_id", pa.int64(), nullable=False),
        pa.field("replayed", pa.bool_()),
        pa.field("finished_at", _TIMESTAMP),
        pa.field("duration_ms", pa.int64()),
        *(pa.field(name, pa.int64()) for name in _COUNTERS),
        pa.field("retried_by_tier", pa.list_(pa.int64())),
        pa.field("lateness_p50_ms_by_tier", pa.list_(pa.int64())),
        pa.field("lateness_p99_ms_by_tier", pa.list_(pa.int64())),
        pa.field("oldest_waiting_ms_by_tier", pa.list_(pa.int64())),
        pa.field("breaker", pa.string()),
        pa.field("paused_ms", pa.int64()),
        pa.field("dead_letters_waiting", pa.int64()),
        pa.field("oldest_dead_letter_age_ms", pa.int64()),
        pa.field(
            "input_lag",
            pa.list_(
                pa.struct(
                    [
                        pa.field("topic", pa.string()),
                        pa.field("lag", pa.int64()),
                        pa.field("not_due", pa.int64()),
                    ]
                )
            ),
        ),
    ]
)
"""Columns of the metrics Delta table, one row per batch (see the module docstring)."""


@dataclass(frozen=True)
class Positions:
    """Where the job stands after a batch in every partition it reads: `start`, the batch's
    end offsets (a partition it has not read yet from its earliest), and `latest`."""

    start: dict[PartitionKey, int]
    latest: dict[PartitionKey, int]


def positions_after(
    config: AnyConfig, end: Mapping[PartitionKey, int], kafka: KafkaOffsets
) -> Positions:
    """The job's `Positions` after a batch that ended at `end`, looked up once for
    `input_lag` and `oldest_waiting_ms`."""
    delays = config.delayed_topics()
    found = kafka.partitions([*config.kafka.topics, *delays], config.kafka.topic_pattern)
    keys = [(topic, p) for topic, partitions in found.items() for p in partitions]
    start = {key: end[key] for key in keys if key in end}
    start.update(kafka.earliest([key for key in keys if key not in end]))
    return Positions(start, kafka.latest(keys))


def input_lag(
    config: AnyConfig, positions: Positions, kafka: KafkaOffsets, now_ms: int
) -> dict[str, dict[str, int]]:
    """Per topic, records past the job's positions that are ready ("lag") and, on retry
    topics (or a delay router's topics), those still inside their delay ("not_due")."""
    delays = config.delayed_topics()
    latest = positions.latest
    tier_keys = [key for key in latest if key[0] in delays]
    frontier = delay_frontier(
        kafka.first_at({key: due_timestamp_ms(now_ms, delays[key[0]]) for key in tier_keys}),
        {key: latest[key] for key in tier_keys},
    )
    lag: dict[str, dict[str, int]] = {}
    for key, newest in latest.items():
        position = positions.start[key]
        ready = frontier.get(key, newest)
        figures = lag.setdefault(key[0], {"lag": 0, "not_due": 0})
        figures["lag"] += max(0, ready - position)
        figures["not_due"] += max(0, newest - max(ready, position))
    return lag


def oldest_waiting_ms(
    config: AnyConfig, retry_tiers: Sequence[RetryTier], positions: Positions, now_ms: int
) -> list[int | None]:
    """Per tier of `retry_tiers`, the age of the longest-waiting record at the head of the
    tier's partitions past the job's positions, counted from its last failure; None where nothing
    waits."""
    tiers = [set(tier.topics.values()) for tier in retry_tiers]
    if not tiers:
        return []
    tier_topics = set().union(*tiers)
    keys = [key for key in positions.latest if key[0] in tier_topics]
    start = {key: positions.start[key] for key in keys}
    latest = positions.latest
    # Two offsets reach a head record even behind a transaction marker.
    heads = {key: min(latest[key], start[key] + 2) for key in keys}
    since: dict[str, int] = {}
    if any(heads[key] > start[key] for key in keys):
        kafka_config = config.kafka
        consumer = reading_consumer(
            kafka_config.bootstrap_servers, kafka_config.client_options(), "retrylib-metrics"
        )
        try:
            for message in ReadToEnd(consumer, start, heads).messages(timeout_s=_HEAD_READ_S):
                _, ours = split_headers(message.headers())
                failed = header_ms(ours, LAST_FAILURE, message.timestamp()[1])
                since[message.topic()] = min(failed, since.get(message.topic(), failed))
        finally:
            consumer.close()
    ages = []
    for topics in tiers:
        waiting = [since[topic] for topic in topics if topic in since]
        ages.append(max(0, now_ms - min(waiting)) if waiting else None)
    return ages


_HEAD_READ_S = 5.0


def metrics_row(
    result: BatchResult,
    *,
    job: str,
    tiers: int,
    finished_ms: int,
    lag: Mapping[str, Mapping[str, int]] | None,
    waiting: list[int | None] | None = None,
    breaker: str | None = None,
    paused_ms: int | None = None,
    dead_letters: tuple[int, int | None] | None = None,
) -> dict[str, Any]:
    """The figures of one batch, as logged (JSON-ready; see the module docstring);
    `waiting` is `oldest_waiting_ms_by_tier`, `dead_letters` the dead letters waiting and
    the oldest one's age."""
    counters = result.counters
    by_tier = [int(counters.get(retried_tier(i), 0)) for i in range(tiers)]
    row: dict[str, Any] = {
        "job": job,
        "batch_id": result.batch_id,
        "replayed": result.replayed,
        "finished_at": datetime.fromtimestamp(finished_ms / 1000, UTC).isoformat(
            timespec="milliseconds"
        ),
        "duration_ms": result.duration_ms,
    }
    for name in _REPORTED_COUNTS:
        row[name] = int(counters.get(name, 0))
    row[Count.RETRIED] = retried(counters)
    row["retried_by_tier"] = by_tier
    row["produced"] = result.produced
    for index, name in enumerate(("p50", "p99")):
        row[f"lateness_{name}_ms_by_tier"] = [
            result.lateness_ms[tier][index] if tier in result.lateness_ms else None
            for tier in range(tiers)
        ]
    row["oldest_waiting_ms_by_tier"] = waiting
    row["breaker"] = breaker
    row["paused_ms"] = paused_ms
    row["dead_letters_waiting"], row["oldest_dead_letter_age_ms"] = dead_letters or (None, None)
    row["input_lag"] = {topic: dict(figures) for topic, figures in lag.items()} if lag else None
    return row


def table_row(row: Mapping[str, Any]) -> dict[str, Any]:
    """`row` (from `metrics_row`) in the shape of `METRICS_SCHEMA`."""
    lag = row["input_lag"]
    return {
        **row,
        "finished_at": datetime.fromisoformat(row["finished_at"]),
        "input_lag": None
        if lag is None
        else [{"topic": topic, **figures} for topic, figures in sorted(lag.items())],
    }


def metrics_struct():
    """`METRICS_SCHEMA` as a Spark StructType."""
    from pyspark.sql.pandas.types import from_arrow_schema

    return from_arrow_schema(METRICS_SCHEMA)


class MetricsRecorder:
    """The `on_result` callback that logs and stores each batch's metrics.

    `app_id` is the job's Delta app id (the batch commit's); rows are committed under
    "<app_id>:metrics". `retry_tiers` are the job's (none for a delay router): the row
    gives figures per tier. `forward` is called with each result afterwards (a caller's own
    callback). A `breaker`'s state (after the batch: the job feeds it first) goes into the
    row. Call `prepare(spark)` before the query starts: it creates the table if
    configured, through that session.
    """

    def __init__(
        self,
        config: AnyConfig,
        app_id: str,
        retry_tiers: Sequence[RetryTier],
        forward=None,
        breaker: Breaker | None = None,
        dead_letters: TableRef | None = None,
    ) -> None:
        self.config = config
        self.retry_tiers = tuple(retry_tiers)
        self.breaker = breaker
        self.app_id = f"{app_id}:metrics"
        self.forward = forward
        self._kafka: KafkaOffsets | None = None
        self._spark = None
        self._table = config.metrics.table_ref()
        self._checkpoint = Checkpoint(config.job.checkpoint)
        self._dead_letters = dead_letters
        self._dead_letters_read_ms: int | None = None
        self._dead_letters_reading: Started | None = None
        # (count, the oldest one's epoch ms) as last read; None: unknown
        self._waiting_as_read: tuple[int, int | None] | None = None

    def prepare(self, spark) -> None:
        self._spark = spark
        if self._table is not None:
            ensure_table(spark, self._table, metrics_struct(), what="metrics", evolve=True)

    def on_result(self, result: BatchResult) -> None:
        try:
            self.record(result)
        except Exception as e:  # metrics must never fail the batch
            log.warning("metrics of batch %d not recorded: %s", result.batch_id, e)
        if self.forward is not None:
            self.forward(result)

    def record(self, result: BatchResult) -> dict[str, Any]:
        """Log the batch's metrics line and append it to the table; returns the row."""
        now_ms = int(time.time() * 1000)
        row = metrics_row(
            result,
            job=self.config.job.name,
            tiers=len(self.retry_tiers),
            finished_ms=now_ms,
            breaker=None if self.breaker is None else self.breaker.state_name(),
            paused_ms=None if self.breaker is None else self.breaker.take_paused_ms(),
            dead_letters=self._dead_letters_waiting(now_ms),
            **self._backlog(result.batch_id, now_ms),
        )
        log.info(json.dumps(row))
        if self._table is not None and self._spark is not None:
            try:
                frame = self._spark.createDataFrame([table_row(row)], metrics_struct())
                append_once(
                    frame, self._table, app_id=self.app_id, batch_id=row["batch_id"], evolve=True
                )
            except Exception as e:
                log.warning(
                    "metrics row of batch %d not written to %s: %s",
                    result.batch_id,
                    self.config.metrics.table,
                    e,
                )
        return row

    def on_decided(self, manifest: Mapping[str, Any]) -> None:
        """Told a batch's decisions (its `manifest`) before its effects are made: when the
        dead letters are due to be read and the batch appends none, the table will not change
        in this batch, so it is read now, beside the effects, rather than after them (a cold
        read costs a run's first batch 1.3 s on local[2])."""
        now_ms = int(time.time() * 1000)
        try:
            if self._dead_letters_due(now_ms) and not manifest["rows"].get("dead_letter"):
                self._dead_letters_read_ms = now_ms
                self._dead_letters_reading = Started(
                    self._spark, self._read_dead_letters, background=True
                )
        except Exception as e:  # metrics must never fail the batch; `record` reads it then
            log.warning("dead letters not read ahead: %s", e)

    def _dead_letters_due(self, now_ms: int) -> bool:
        if self._dead_letters is None or self._spark is None:
            return False
        last = self._dead_letters_read_ms
        return last is None or now_ms - last >= self.config.metrics.dead_letter_every_ms

    def _dead_letters_waiting(self, now_ms: int) -> tuple[int, int | None] | None:
        """The dead letters waiting and the oldest one's age at `now_ms`, as of the last read
        of the dead-letter table, read again when `dead_letter_every` has passed since (in
        this batch's `on_decided`, or now)."""
        if self._dead_letters is None or self._spark is None:
            return None
        reading, self._dead_letters_reading = self._dead_letters_reading, None
        if reading is not None or self._dead_letters_due(now_ms):
            if reading is None:
                self._dead_letters_read_ms = now_ms
            try:
                self._waiting_as_read = (
                    self._read_dead_letters() if reading is None else reading.result()
                )
            except Exception as e:
                log.warning("dead letters waiting unknown: %s", e)
                self._waiting_as_read = None
        if self._waiting_as_read is None:
            return None
        count, oldest_ms = self._waiting_as_read
        return count, None if oldest_ms is None else max(now_ms - oldest_ms, 0)

    def _read_dead_letters(self) -> tuple[int, int | None]:
        """(count, the oldest one's epoch ms) of the dead letters waiting in the table."""
        count, oldest = DeadLetterTable(self._spark, self._dead_letters).waiting()
        return count, None if oldest is None else int(oldest.timestamp() * 1000)

    def _backlog(self, batch_id: int, now_ms: int) -> dict[str, Any]:
        """`metrics_row`'s `lag` and `waiting` after batch `batch_id`, None when unknown."""
        try:
            end, _ = self._checkpoint.batch_offsets(self._spark, batch_id)
            if self._kafka is None:
                kafka = self.config.kafka
                self._kafka = KafkaOffsets(kafka.bootstrap_servers, kafka.client_options())
            positions = positions_after(self.config, end, self._kafka)
            return {
                "lag": input_lag(self.config, positions, self._kafka, now_ms),
                "waiting": oldest_waiting_ms(self.config, self.retry_tiers, positions, now_ms),
            }
        except Exception as e:
            log.warning("input lag after batch %d unknown: %s", batch_id, e)
            return {"lag": None, "waiting": None}
