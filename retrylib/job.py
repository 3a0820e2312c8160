"""Starting the streaming query from a config, and running it until done or told to stop."""

from __future__ import annotations

import json
import logging
import signal
import threading
import time
from collections.abc import Callable

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming import StreamingQuery

from retrylib.batch_task import TaskPlan
from retrylib.compaction import Compactor
from retrylib.config import Config
from retrylib.dead_letter import dead_letter_struct
from retrylib.delta_tables import ensure_table
from retrylib.errors import TopicError
from retrylib.kafka_client import (
    TIER_CLIENT_OPTIONS,
    RecordLimits,
    ensure_topics,
    make_admin,
    partition_counts,
)
from retrylib.logs import config_secrets, redact_secrets, spark_log_conf
from retrylib.metrics import MetricsRecorder, spark_checkpoint
from retrylib.record_size import producer_batch_bytes
from retrylib.router import BatchResult, BatchRouter, checkpoint_identity, signing_key
from retrylib.session import build_spark_session
from retrylib.shipping import ship_handler
from retrylib.staging import control_topic
from retrylib.storage import join

log = logging.getLogger(__name__)

_BUILTIN_KAFKA = "org.apache.spark.sql.kafka010.KafkaSourceProvider"
_STOP_WAIT_SECONDS = 120


def builtin_kafka_available(spark: SparkSession) -> bool:
    """True when Spark's own Kafka connector is on the classpath (Databricks, EMR, --packages)."""
    # Through Spark's class loader: jars given to spark-submit (--jars, spark.jars) are not
    # on the system class path that a plain Class.forName would search from py4j.
    try:
        spark.sparkContext._jvm.org.apache.spark.util.Utils.classForName(
            _BUILTIN_KAFKA, True, False
        )
        return True
    except Exception:
        return False


TIER_CLOCK_ALLOWANCE_MS = 300_000
"""How far past one tier delay a tier record's timestamp may lie ahead of the broker's clock.

The job writes a tier record with a timestamp at most one delay after it writes it
(`retry_policy.tier_timestamp_ms`); a tier releases records in offset order, so a record
with a later timestamp holds back every record behind it. A tier topic the job creates has
`message.timestamp.after.max.ms` = delay + this allowance (for clocks that disagree), so
the broker refuses anyone's record that would hold a tier partition up for longer.
"""


def prepare_topics(config: Config) -> dict[str, int]:
    """Check the main topics; create missing retry, dead-letter and control topics if allowed.

    Returns the partition count of every retry and dead-letter topic. Raises `TopicError`
    naming a missing main topic, or missing other topics when `kafka.create_topics` is off.
    """
    kafka = config.kafka
    admin = make_admin(kafka.bootstrap_servers, kafka.options)
    main = partition_counts(admin, kafka.topics)
    missing = [topic for topic in kafka.topics if topic not in main]
    if missing:
        raise TopicError(
            f"kafka.topics: topic(s) {missing} do not exist on {kafka.bootstrap_servers}"
        )
    wanted = {
        tier.topics[topic]: count for tier in config.retry.tiers for topic, count in main.items()
    }
    wanted[config.dead_letter.topic] = max(main.values())
    wanted[control_topic(config.job.name)] = 1
    tier_configs = {
        topic: {"message.timestamp.after.max.ms": str(delay_ms + TIER_CLOCK_ALLOWANCE_MS)}
        for topic, delay_ms in config.retry.tier_delays_ms().items()
    }
    ensure_topics(admin, wanted, create=kafka.create_topics, configs=tier_configs)
    return partition_counts(admin, wanted)


def _read_kafka(spark: SparkSession, format_name: str, options: dict[str, str]) -> DataFrame:
    return spark.readStream.format(format_name).options(**options).load()


def source_frame(spark: SparkSession, config: Config) -> DataFrame:
    """Every topic the job reads: the main topics, and the retry tiers up to what is due.

    With Spark's Kafka connector (`kafka.source` "builtin", or "auto" with the connector on
    the classpath) the main topics come from it as records, in a union with one
    `retrylib_kafka` source for the tiers, emitting records too. With "python" it is one
    `retrylib_kafka` source for all of them, emitting offset ranges
    (`retrylib.emit = ranges`) that the routing tasks read themselves: records skip the
    JVM, and `maxOffsetsPerTrigger` bounds a batch, retries included.
    """
    kafka = config.kafka
    delays = config.retry.tier_delays_ms()
    # Records of aborted transactions (a failed `retrylib redrive`, a user's transactional
    # producer) are never handed to the handler, unless the user's options say otherwise.
    common = {"kafka.isolation.level": "read_committed"}
    common.update({f"kafka.{key}": value for key, value in kafka.options.items()})
    common["kafka.bootstrap.servers"] = kafka.bootstrap_servers
    main = {
        **common,
        "subscribe": ",".join(kafka.topics),
        "startingOffsets": kafka.starting_offsets,
    }
    if kafka.max_offsets_per_trigger:
        main["maxOffsetsPerTrigger"] = str(kafka.max_offsets_per_trigger)
    tiers = {
        **common,
        # The source's offset look-ups: a tier's end must not pass an open transaction.
        **{f"kafka.{key}": value for key, value in TIER_CLIENT_OPTIONS.items()},
        "subscribe": ",".join(sorted(delays)),
        "retrylib.topicDelaysMs": json.dumps(delays),
    }
    if kafka.source == "builtin" or (kafka.source == "auto" and builtin_kafka_available(spark)):
        log.info("main topics read with Spark's built-in kafka source")
        frame = _read_kafka(spark, "kafka", {**main, "includeHeaders": "true"})
        return frame.unionByName(_read_kafka(spark, "retrylib_kafka", tiers)) if delays else frame
    log.info("main topics and retry tiers read with the retrylib_kafka Python data source")
    every_topic = {
        **main,
        **tiers,
        "subscribe": ",".join([*kafka.topics, *sorted(delays)]),
        "retrylib.emit": "ranges",
        # One input partition per core: Spark pays a Python round trip per input partition.
        "retrylib.rangeGroups": str(spark.sparkContext.defaultParallelism),
    }
    return _read_kafka(spark, "retrylib_kafka", every_topic)


def task_plan(config: Config, partitions: dict[str, int], signing_key: bytes) -> TaskPlan:
    """The per-batch plan with batch id and clock still unset (the router fills them in)."""
    retry = config.retry
    return TaskPlan(
        job=config.job.name,
        batch_id=-1,
        now_ms=0,
        handler=config.handler.function,
        handler_paths=config.handler.paths,
        timeout_seconds=config.handler.timeout_seconds,
        output_schema=config.handler.output_schema.to_arrow(),
        dead_letter_topic=config.dead_letter.topic,
        retry_topics={
            topic: tuple(tier.topics[topic] for tier in retry.tiers)
            for topic in config.kafka.topics
        },
        tier_delays_ms=tuple(round(d * 1000) for d in retry.delays_seconds),
        max_retry_after_ms=retry.max_retry_after_ms,
        signing_key=signing_key,
        partition_counts=partitions,
        max_attempts=retry.max_attempts,
        jitter=retry.jitter,
        non_retryable=retry.non_retryable,
        handler_kind=config.handler.kind,
        bootstrap_servers=config.kafka.bootstrap_servers,
        client_options=dict(config.kafka.options),
    )


def record_limits(
    config: Config, partitions: dict[str, int]
) -> tuple[RecordLimits, dict[str, str]]:
    """The size limits of the topics retrylib produces to (looked up once now, so a topic
    that is too small stops the job before it starts), and the Kafka options of its
    producer: the job's, with a `batch.size` no topic's limit is below.

    Raises `TopicError` as `RecordLimits.current`, `ConfigError` for a Kafka option that
    is not a number.
    """
    kafka = config.kafka
    control = control_topic(config.job.name)
    limits = RecordLimits(
        kafka.bootstrap_servers, kafka.options, [t for t in partitions if t != control]
    )
    limits.current()
    options = dict(kafka.options)
    batch_bytes = producer_batch_bytes(options, limits.topic_max)
    if batch_bytes is not None:
        log.info(
            "retry and dead-letter records produced in batches of at most %d bytes", batch_bytes
        )
        options["batch.size"] = str(batch_bytes)
    return limits, options


def start_query(
    spark: SparkSession,
    config: Config,
    *,
    available_now: bool = False,
    on_result: Callable[[BatchResult], None] | None = None,
) -> tuple[StreamingQuery, BatchRouter]:
    """Prepare topics and tables, then start the streaming query; returns it and its router.

    Every batch's metrics are logged, and stored when `[metrics] table` is set
    (`retrylib.metrics`); `on_result` is then called with the batch's `BatchResult`.
    """
    partitions = prepare_topics(config)
    output = config.output.table_ref()
    dead_letter = config.dead_letter.table_ref()
    ensure_table(
        spark,
        output,
        config.handler.output_schema.to_spark(),
        what="output",
        partition_by=config.output.partition_by,
        properties=config.output.properties,
        evolve=config.output.schema_evolution,
    )
    ensure_table(spark, dead_letter, dead_letter_struct(), what="dead-letter")
    state_dir = join(config.job.checkpoint, "retrylib")
    app_id = checkpoint_identity(spark, state_dir, config.job.name)
    metrics = MetricsRecorder(config, app_id, forward=on_result)
    metrics.prepare(spark)
    limits, producer_options = record_limits(config, partitions)
    compactor = None
    if config.output.optimize_every_ms is not None:
        tables = [("output", output), ("dead-letter", dead_letter)]
        if config.metrics.table_ref() is not None:
            tables.append(("metrics", config.metrics.table_ref()))
        compactor = Compactor(state_dir, config.output.optimize_every_ms, tables)
    router = BatchRouter(
        task_plan(config, partitions, signing_key(spark, state_dir)),
        state_dir=state_dir,
        app_id=app_id,
        kafka_options=producer_options,
        bootstrap_servers=config.kafka.bootstrap_servers,
        output_table=output,
        evolve_output=config.output.schema_evolution,
        dead_letter_table=dead_letter,
        record_limits=limits,
        on_result=metrics.on_result,
        compactor=compactor,
    )
    writer = (
        source_frame(spark, config)
        .writeStream.queryName(config.job.name)
        .option("checkpointLocation", spark_checkpoint(config))
        .foreachBatch(router)
    )
    if available_now:
        writer = writer.trigger(availableNow=True)
    else:
        writer = writer.trigger(processingTime=f"{config.job.trigger_seconds} seconds")
    return writer.start(), router


def stop_gracefully(
    query: StreamingQuery, router: BatchRouter, timeout: float = _STOP_WAIT_SECONDS
) -> None:
    """Stop `query` once the batch running now (if any) has done its work, within `timeout`.

    The stop comes right after the router finishes that batch, before another one starts.
    Spark may not have recorded the batch as done yet; it is then replayed on restart, which
    reuses its manifest and commits nothing twice.
    """
    router.batch_finished.clear()
    deadline = time.monotonic() + timeout
    while (
        query.isActive
        and query.status.get("isTriggerActive")
        and not router.batch_finished.wait(0.05)
        and time.monotonic() < deadline
    ):
        pass
    query.stop()


def run(config: Config, *, available_now: bool = False, master: str | None = None) -> int:
    """Run the job until it finishes (available-now), fails, or gets SIGTERM/SIGINT.

    Returns the process exit code: 0 when it finished or was stopped, 1 when the query
    failed (the error is logged).
    """
    redact_secrets(config_secrets(config))
    spark = build_spark_session(
        f"retrylib-{config.job.name}", master=master, extra=spark_log_conf()
    )
    ship_handler(spark, config.handler)
    stop_requested = threading.Event()

    def request_stop(signum: int, frame: object) -> None:
        log.info("received %s: stopping after the current batch", signal.Signals(signum).name)
        stop_requested.set()

    previous = {sig: signal.signal(sig, request_stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    query, router = start_query(spark, config, available_now=available_now)
    try:
        while query.isActive and not stop_requested.is_set():
            query.awaitTermination(0.5)
        if stop_requested.is_set():
            stop_gracefully(query, router)
        error = query.exception()
        if error is not None:
            log.error("query %s failed: %s", config.job.name, error)
            return 1
        return 0
    finally:
        router.close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
