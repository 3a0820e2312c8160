"""`retrylib status`: what a job is holding, read from Kafka, the checkpoint and its tables.

Nothing here changes anything. Kafka and the checkpoint are read directly; the Delta tables
through Spark (`tool_session`), so a path or a catalog name works alike. Where each figure
comes from:

- The job's position: the end offsets of the last batch Spark marked complete
  (`<checkpoint>/spark/commits/<N>` and `offsets/<N>`). Before the first completed batch,
  retry topics count from their earliest offset and main-topic lag is unknown (null).
- Main topics: `lag` = latest offset - position, summed over partitions.
- Retry tiers: the records between the position and the end of each tier topic are read
  (read_committed, so aborted records and transaction markers are not counted) and counted:
  `waiting` in all, `due` (their `retrylib.not_before` has passed, so the next batch takes
  them), `oldest_waiting_since` (earliest `retrylib.last_failure`: when the longest-waiting
  one failed and entered the tier), `next_due_at` (earliest `retrylib.not_before`; in the
  past means due already). At most `scan_limit` records are read per tier; beyond that
  the rest are counted by offsets (an upper bound) and `exact` is false.
- Delay topics (a delay router's, `delay_topics`): counted as a tier's records are, each
  due at its Kafka timestamp + the topic's delay (the senders' `msg_ts` is not read).
- Retry tiers and delay topics alike: `stamped_ahead` counts the records whose Kafka
  timestamp is further ahead of this clock than the job's producers stamp
  (`policy.latest_fair_timestamp_ms`), `first_stamped_ahead` names the first
  (`topic[partition]@offset`, how far ahead): a producer's clock is off; the job reads such
  a record at once and the records behind it as they fall due (`kafka.source`).
  `dead_letters` is null for a router, and its last batches count what it forwarded.
- Dead letters: counted by error class from the dead-letter Delta table, with how many
  were redriven and how many a redrive claimed but has not confirmed yet; `waiting` (not
  redriven), the age of the oldest of those (`oldest_waiting_age_seconds`), and `looping` (waiting
  after `dead_letter.max_redrives` redrives).
- Breaker (`[breaker]` set, else null): its last change of state as the running job put it
  in `<checkpoint>/retrylib/breaker.json`: `state` (open, closed, paused), `since`, `why`,
  and while open `next_probe_at`.
- Key order (`retry.key_ordered` set, else null): the queues the job stored after its last
  batch (`<checkpoint>/retrylib/key_order/`): `blocked_keys`, `held_records` (records
  waiting behind their key's first), `after_batch`, and the `longest_queues` (at most 5:
  main topic, partition, key, `waiting`, the `tier` and `due_at` of its first record).
- Last batches: from the metrics table when `[metrics] table` is set and holds rows, else
  from the router's manifests under `<checkpoint>/retrylib/manifests` (counters only).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from confluent_kafka import KafkaError, KafkaException

from retrylib.batch.key_order_store import stored_queues
from retrylib.config.durations import format_duration
from retrylib.config.model import AnyConfig, DeadLetterConfig, RetryTier
from retrylib.errors import DamagedFile
from retrylib.job.kinds import JobKind, kind_of
from retrylib.kafka.clients import kafka_error_text, login_refusal
from retrylib.kafka.offsets import PartitionKey
from retrylib.kafka.reading import KafkaOffsets, ReadToEnd, reading_consumer
from retrylib.retry import headers
from retrylib.retry.outcomes import Count, retried
from retrylib.retry.policy import due_time_ms, latest_fair_timestamp_ms
from retrylib.spark.session import tool_session
from retrylib.state.checkpoint import Checkpoint
from retrylib.state.files import read_json

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from retrylib.config.table_ref import TableRef

log = logging.getLogger(__name__)
_LONGEST_QUEUES = 5  # key queues `status` lists

DEFAULT_SCAN_LIMIT = 10_000


def collect_status(
    config: AnyConfig,
    *,
    spark: SparkSession | None = None,
    batches: int = 5,
    timeout: float = 5.0,
    scan_limit: int = DEFAULT_SCAN_LIMIT,
) -> dict[str, Any]:
    """The job's status as plain JSON-ready data (see the module docstring for each part).

    Kafka is given `timeout` seconds to answer; when it does not, `broker.reachable` is false
    and the topic sections are empty. The tables and the checkpoint are read through `spark`,
    or through `tool_session()` when it is None. A missing table or checkpoint is reported
    in place (`exists: false`), not raised.
    """
    kind = kind_of(config)
    metrics = config.metrics.table_ref()
    if spark is None:
        spark = tool_session(f"retrylib-status-{config.job.name}")
    now_ms = int(time.time() * 1000)
    checkpoint = Checkpoint(config.job.checkpoint)
    committed = checkpoint.last_committed_batch(spark)
    position: dict[PartitionKey, int] = {}
    last_batch = None
    if committed is not None:
        try:
            position, triggered_ms = checkpoint.batch_offsets(spark, committed)
            last_batch = {"id": committed, "triggered_at": _iso(triggered_ms)}
        except DamagedFile as error:  # the job's position unknown: tiers count from earliest
            last_batch = {"id": committed, "triggered_at": None, "damaged": str(error)}
    errors: list[KafkaError] = []
    kafka = KafkaOffsets(
        config.kafka.bootstrap_servers,
        config.kafka.client_options(),
        timeout=timeout,
        errors=errors,
    )
    broker: dict[str, Any] = {
        "bootstrap_servers": config.redacted()["kafka"]["bootstrap_servers"],
        "reachable": True,
        "error": None,
    }
    main_topics: list[dict[str, Any]] = []
    tiers: list[dict[str, Any]] = []
    try:
        main_topics = _main_topics(config, kafka, position, known=committed is not None)
        tiers = [
            _tier(config, tier, kafka, position, now_ms, timeout, scan_limit)
            for tier in kind.shown_tiers()
        ]
    except KafkaException as e:
        broker["reachable"] = False
        kafka.serve_errors()
        refused = login_refusal(errors, broker["bootstrap_servers"], config.kafka_login())
        broker["error"] = refused or (errors[0].str() if errors else kafka_error_text(e))
    status = {
        "job": config.job.name,
        "generated_at": _iso(now_ms),
        "checkpoint": config.job.checkpoint,
        "last_completed_batch": last_batch,
        "broker": broker,
        "main_topics": main_topics,
        "retry_tiers": [],
        "delay_topics": [],
        "dead_letters": None,
        "breaker": None,
        "key_order": None,
        "last_batches": last_batches(spark, config, metrics, batches),
    }
    status[kind.tiers_shown_as] = tiers
    status.update(_held(spark, kind, checkpoint, now_ms))
    return status


def _held(
    spark: SparkSession, kind: JobKind, checkpoint: Checkpoint, now_ms: int
) -> dict[str, Any]:
    """The job's dead letters, and its breaker's state and key queues, each when it has them."""
    dead = kind.dead_letter
    return {
        "dead_letters": None if dead is None else dead_letter_summary(spark, dead, now_ms),
        "breaker": None if kind.breaker is None else _breaker(spark, checkpoint),
        "key_order": _key_order(spark, checkpoint) if kind.key_ordered else None,
    }


def _breaker(spark: SparkSession, checkpoint: Checkpoint) -> dict[str, Any]:
    """The breaker's last change of state as the running job published it (`breaker`)."""
    try:
        published = read_json(spark, checkpoint.breaker)
    except DamagedFile as error:
        return {"state": None, "since": None, "why": str(error)}
    if published is None:
        return {"state": None, "since": None, "why": "the job has not run with [breaker] yet"}
    return {
        "state": "paused" if published.get("paused") else published["state"],
        "since": _iso(published["since_ms"]),
        "why": published["why"],
        "next_probe_at": _iso(published["probe_at_ms"]),
    }


def _key_order(spark: SparkSession, checkpoint: Checkpoint) -> dict[str, Any]:
    """The key queues as the job stored them after its last batch (`key_order_store`)."""
    stored = stored_queues(spark, checkpoint.key_order)
    if stored is None:
        return {"blocked_keys": 0, "held_records": 0, "after_batch": None, "longest_queues": []}
    after_batch, queues_by_key = stored
    queues = sorted(queues_by_key.items(), key=lambda item: -len(item[1].offsets))
    return {
        "blocked_keys": len(queues),
        "held_records": sum(len(queue.offsets) - 1 for _, queue in queues),
        "after_batch": after_batch,
        "longest_queues": [
            {
                "topic": topic,
                "partition": partition,
                "key": key.decode("utf-8", errors="replace"),
                "waiting": len(queue.offsets),
                "tier": queue.tier + 1,
                "due_at": _iso(queue.not_before_ms),
            }
            for (topic, partition, key), queue in queues[:_LONGEST_QUEUES]
        ],
    }


def _main_topics(
    config: AnyConfig, kafka: KafkaOffsets, position: Mapping[PartitionKey, int], known: bool
) -> list[dict[str, Any]]:
    found = kafka.partitions(config.kafka.topics, config.kafka.topic_pattern)
    topics = list(dict.fromkeys([*config.kafka.topics, *found]))
    keys = [(topic, p) for topic, partitions in found.items() for p in partitions]
    latest = kafka.latest(keys)
    result = []
    for topic in topics:
        if topic not in found:
            result.append({"topic": topic, "exists": False, "partitions": 0, "lag": None})
            continue
        lag = None
        if known:
            lag = sum(
                max(0, latest[(topic, p)] - position.get((topic, p), 0)) for p in found[topic]
            )
        result.append({"topic": topic, "exists": True, "partitions": len(found[topic]), "lag": lag})
    return result


def _tier(
    config: AnyConfig,
    tier: RetryTier,
    kafka: KafkaOffsets,
    position: Mapping[PartitionKey, int],
    now_ms: int,
    timeout: float,
    scan_limit: int,
) -> dict[str, Any]:
    topics = sorted(set(tier.topics.values()))
    found = kafka.partitions(topics)
    keys = [(topic, p) for topic, partitions in found.items() for p in partitions]
    earliest = kafka.earliest(keys)
    latest = kafka.latest(keys)
    start = {key: max(position.get(key, earliest[key]), earliest[key]) for key in keys}
    fair_until_ms = latest_fair_timestamp_ms(
        now_ms, tier.delay_ms, config.stamps_delayed_topics_ahead()
    )
    scan = _scan(config, start, latest, tier.delay_ms, now_ms, fair_until_ms, timeout, scan_limit)
    oldest, next_due = scan["oldest_ms"], scan["next_due_ms"]
    return {
        "tier": tier.index + 1,
        "delay": format_duration(tier.delay_ms),
        "delay_seconds": tier.delay_ms / 1000,
        "topics": topics,
        "missing_topics": [topic for topic in topics if topic not in found],
        "waiting": scan["waiting"],
        "due": scan["due"],
        "not_due": scan["waiting"] - scan["due"],
        "exact": scan["exact"],
        "oldest_waiting_since": _iso(oldest),
        "oldest_waiting_age_seconds": None if oldest is None else (now_ms - oldest) / 1000,
        "next_due_at": _iso(next_due),
        "next_due_in_seconds": None if next_due is None else (next_due - now_ms) / 1000,
        "stamped_ahead": scan["stamped_ahead"],
        "first_stamped_ahead": scan["first_stamped_ahead"],
    }


def _scan(
    config: AnyConfig,
    start: Mapping[PartitionKey, int],
    latest: Mapping[PartitionKey, int],
    delay_ms: int,
    now_ms: int,
    fair_until_ms: int,
    timeout: float,
    limit: int,
) -> dict[str, Any]:
    """Read the committed records from `start` to the end of each partition (at most
    `limit` in all) and summarise them; see the module docstring.
    """
    summary: dict[str, Any] = {
        "waiting": 0,
        "due": 0,
        "exact": True,
        "oldest_ms": None,
        "next_due_ms": None,
        "stamped_ahead": 0,
        "first_stamped_ahead": None,
    }
    if all(latest[key] <= offset for key, offset in start.items()):
        return summary
    consumer = reading_consumer(
        config.kafka.bootstrap_servers, config.kafka.client_options(), "retrylib-status"
    )
    try:
        read = ReadToEnd(consumer, start, latest)
        for message in read.messages(timeout_s=max(timeout, 1.0) * 3, limit=limit):
            _count(summary, message, delay_ms, now_ms)
            if message.timestamp()[1] > fair_until_ms:
                _count_stamped_ahead(summary, message, now_ms)
    finally:
        consumer.close()
    unfinished = read.unfinished
    if unfinished:
        summary["exact"] = False
        summary["waiting"] += sum(
            max(0, latest[key] - offset) for key, offset in unfinished.items()
        )
    return summary


def _count(summary: dict[str, Any], message: Any, delay_ms: int, now_ms: int) -> None:
    _, ours = headers.split_headers(message.headers())
    timestamp = message.timestamp()[1]
    not_before = headers.header_ms(ours, headers.NOT_BEFORE, due_time_ms(timestamp, delay_ms))
    entered = headers.header_ms(ours, headers.LAST_FAILURE, timestamp)
    summary["waiting"] += 1
    summary["due"] += not_before <= now_ms
    summary["oldest_ms"] = min(entered, summary["oldest_ms"] or entered)
    summary["next_due_ms"] = min(not_before, summary["next_due_ms"] or not_before)


def _count_stamped_ahead(summary: dict[str, Any], message: Any, now_ms: int) -> None:
    summary["stamped_ahead"] += 1
    if summary["first_stamped_ahead"] is None:
        ahead = format_duration((message.timestamp()[1] - now_ms) // 1000 * 1000)
        where = f"{message.topic()}[{message.partition()}]@{message.offset()}"
        summary["first_stamped_ahead"] = f"{where}, {ahead} ahead"


def dead_letter_summary(
    spark: SparkSession, dead_letter: DeadLetterConfig, now_ms: int
) -> dict[str, Any]:
    """Dead-lettered records by error class (most first), with how many were redriven, how
    many a redrive claimed but has not confirmed (`redrive_pending`), and of those not
    redriven (`waiting`): the oldest's age at `now_ms`, and how many came back after
    `max_redrives` redrives (`looping`: a redrive leaves them out unless told `--again`).
    """
    from pyspark.sql import functions as F

    from retrylib.sinks.dead_letter_table import WAITING, redriven_at_least
    from retrylib.sinks.tables import read_table, table_exists

    table = dead_letter.table_ref()
    if not table_exists(spark, table):
        return {
            "table": str(table),
            "exists": False,
            "total": 0,
            "redriven": 0,
            "waiting": 0,
            "oldest_waiting_age_seconds": None,
            "looping": 0,
            "by_error_class": [],
        }
    pending = F.col("redrive_id").isNotNull() & F.col("redriven_at").isNull()
    waiting = F.expr(WAITING)
    looping = waiting & F.expr(redriven_at_least(dead_letter.max_redrives))
    rows = (
        read_table(spark, table)
        .groupBy("error_class")
        .agg(
            F.count(F.lit(1)).alias("records"),
            F.count("redriven_at").alias("redriven"),
            F.count(F.when(pending, 1)).alias("redrive_pending"),
            F.count(F.when(looping, 1)).alias("looping"),
            F.min("dead_lettered_at").alias("first"),
            F.max("dead_lettered_at").alias("last"),
            F.min(F.when(waiting, F.col("dead_lettered_at"))).alias("oldest_waiting"),
        )
        .orderBy(F.desc("records"), F.asc_nulls_last("error_class"))
        .toArrow()
        .to_pylist()
    )
    classes = [
        {
            "error_class": row["error_class"],
            "records": row["records"],
            "redriven": row["redriven"],
            "redrive_pending": row["redrive_pending"],
            "looping": row["looping"],
            "first_dead_lettered_at": _iso_datetime(row["first"]),
            "last_dead_lettered_at": _iso_datetime(row["last"]),
        }
        for row in rows
    ]
    oldest = [row["oldest_waiting"] for row in rows if row["oldest_waiting"] is not None]
    total, redriven = sum(c["records"] for c in classes), sum(c["redriven"] for c in classes)
    return {
        "table": str(table),
        "exists": True,
        "total": total,
        "redriven": redriven,
        "waiting": total - redriven,
        "oldest_waiting_age_seconds": (
            max(0, now_ms - int(min(oldest).timestamp() * 1000)) // 1000 if oldest else None
        ),
        "looping": sum(c["looping"] for c in classes),
        "by_error_class": classes,
    }


def last_batches(
    spark: SparkSession, config: AnyConfig, metrics: TableRef | None, count: int
) -> dict[str, Any]:
    """The last `count` batches' figures (the job kind's `batch_counts`), newest first, and
    where they came from: the `metrics` table when given and holding rows, else the
    checkpoint's manifests.
    """
    counted = kind_of(config).batch_counts
    if metrics is not None:
        from pyspark.sql import functions as F

        from retrylib.sinks.tables import read_table, table_exists

        if table_exists(spark, metrics):
            rows = (
                read_table(spark, metrics)
                .select("batch_id", "replayed", "duration_ms", *counted, "finished_at")
                .orderBy(F.desc("finished_at"), F.desc("batch_id"))
                .limit(count)
                .toArrow()
                .to_pylist()
            )
            if rows:
                for row in rows:
                    row["at"] = _iso_datetime(row.pop("finished_at"))
                return {"source": "metrics_table", "counts": list(counted), "batches": rows}
    checkpoint = Checkpoint(config.job.checkpoint)
    batches = []
    for number in reversed(checkpoint.manifest_ids(spark)[-count:] if count else []):
        try:
            manifest = read_json(spark, checkpoint.manifest(number))
        except DamagedFile as error:
            batches.append(_damaged_batch(number, counted, error))
            continue
        if manifest is None:  # removed by the job's clean-up since the listing
            continue
        counters = manifest.get("counters", {})
        counts = {name: counters.get(name, 0) for name in counted}
        if Count.RETRIED in counted:  # a manifest counts retries per tier
            counts[Count.RETRIED] = retried(counters)
        batches.append(
            {
                "batch_id": number,
                "at": _iso(manifest.get("now_ms")),
                "replayed": None,
                "duration_ms": None,
                **counts,
            }
        )
    source = "manifests" if batches else None
    return {"source": source, "counts": list(counted), "batches": batches}


def _damaged_batch(number: int, counted: tuple[str, ...], error: DamagedFile) -> dict[str, Any]:
    """A batch whose manifest could not be read: its figures unknown, `damaged` says why."""
    return {
        "batch_id": number,
        "at": None,
        "replayed": None,
        "duration_ms": None,
        **dict.fromkeys(counted),
        "damaged": f"{error.uri}: {error.reason}",
    }


def _iso(ms: int | None) -> str | None:
    if ms is None:
        return None
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="seconds")


def _iso_datetime(value: datetime | None) -> str | None:
    return None if value is None else value.astimezone(UTC).isoformat(timespec="seconds")
