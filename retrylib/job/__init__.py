"""Starting the streaming query from a config, and running it until done or told to stop."""

from __future__ import annotations

import json
import logging
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from confluent_kafka.admin import AdminClient
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming import StreamingQuery

from retrylib import steps
from retrylib.batch.commit import BatchCommit, BatchFunction, no_space_error, task_error
from retrylib.batch.health_watch import HealthWatch
from retrylib.batch.key_order_store import KeyOrderStore
from retrylib.batch.metrics import MetricsRecorder
from retrylib.batch.result import BatchResult
from retrylib.config.importing import import_object
from retrylib.config.model import (
    BATCH_HOOKS,
    RECORD_HOOKS,
    TIER_TIMESTAMP_CONFIG,
    AnyConfig,
    Config,
    KafkaConfig,
    RouterConfig,
)
from retrylib.config.table_ref import TableRef
from retrylib.config.topic_names import produced_topic, subscribed
from retrylib.errors import LeaseHeld, RetrylibError, TopicError
from retrylib.kafka.clients import (
    RecordLimits,
    connected_admin,
    ensure_topics,
    make_admin,
    partition_counts,
)
from retrylib.kafka.offsets import (
    Offsets,
    offsets_to_json,
    progress_end_offsets,
    reached,
)
from retrylib.kafka.reading import Reading, reading_options
from retrylib.kafka.record_size import producer_batch_bytes
from retrylib.kafka.runner_lease import RunnerLease, runner_group, take_lease
from retrylib.logs import (
    configure_worker_logging,
    redact_secrets,
    spark_log_conf,
)
from retrylib.retry.breaker import OPEN, Breaker, BreakerState
from retrylib.retry.outcomes import Count
from retrylib.sinks.compaction import Compactor
from retrylib.sinks.dead_letter import dead_letter_struct
from retrylib.sinks.tables import ensure_table
from retrylib.source.kafka_source import ENGINE_LIMITS_PYTHON_SOURCES, KafkaStreamReader
from retrylib.source.main_reader import CONNECTOR
from retrylib.source.options import (
    OPTION_AVAILABLE_NOW_OFFSETS,
    OPTION_KEY_ORDER,
    parse_source_options,
)
from retrylib.source.stranded import refuse_stranded_retries
from retrylib.spark.connect import default_parallelism, is_connect
from retrylib.spark.session import build_spark_session
from retrylib.spark.shipping import ship_code
from retrylib.spark.signals import stop_requests
from retrylib.state.checkpoint import Checkpoint
from retrylib.state.files import replace_json
from retrylib.task.forwarding import ForwardPlan, run_forwarding_task
from retrylib.task.routing import TaskPlan, run_task

log = logging.getLogger(__name__)

_BUILTIN_KAFKA = "org.apache.spark.sql.kafka010.KafkaSourceProvider"
_JAVA_PARTITIONER = "murmur2_random"  # librdkafka's name for the Java clients' partitioner
_STOP_WAIT_SECONDS = 120
# A cancelled batch ends when its tasks do: Spark kills a task's Python worker within seconds.
_CANCELLED_BATCH_WAIT_SECONDS = 30
_IDLE_MESSAGE = "Waiting for data to arrive"  # Spark's status after a trigger finds no data


def builtin_kafka_available(spark: SparkSession) -> bool:
    """True when Spark's own Kafka connector is on the classpath (Databricks, EMR, --packages).

    Asks Spark to resolve the "kafka" format as a query would: jars added with `--jars` are
    loaded by Spark's class loader, which a plain `Class.forName` from Py4J does not see. A
    Spark Connect client asks the server for the schema of a Kafka stream (no broker is
    asked: the schema is fixed).
    """
    if is_connect(spark):
        return _kafka_format_resolves(spark)
    jvm = spark.sparkContext._jvm
    try:
        found = jvm.org.apache.spark.sql.execution.datasources.DataSource.lookupDataSource(
            "kafka", spark._jsparkSession.sessionState().conf()
        )
    except Exception:
        return False
    return found.getName() == _BUILTIN_KAFKA


def _kafka_format_resolves(spark: SparkSession) -> bool:
    from pyspark.errors import PySparkException

    kafka = (
        spark.readStream.format("kafka")
        .option("subscribe", "retrylib-probe")
        .option("kafka.bootstrap.servers", "localhost:9")
    )
    try:
        return bool(kafka.load().schema)
    except PySparkException as error:
        if error.getCondition() == "DATA_SOURCE_NOT_FOUND":
            return False
        raise


TIER_CLOCK_ALLOWANCE_MS = 300_000
"""How far past one tier delay a tier record's timestamp may lie ahead of the broker's clock.

The job writes a tier record with a timestamp at most one delay after it writes it
(`retry.policy.tier_timestamp_ms`); a tier releases records in offset order, so a record
with a later timestamp holds back every record behind it. A tier topic the job creates has
`message.timestamp.after.max.ms` = delay + this allowance (for clocks that disagree), so
the broker refuses anyone's record that would hold a tier partition up for longer.
"""


def prepare_topics(config: AnyConfig) -> dict[str, int]:
    """Check the main topics; create missing retry, dead-letter and control topics if allowed
    (a delay router's: `_prepare_router_topics`).

    Returns the partition count of every retry and dead-letter topic. Raises
    `KafkaConnectError` when the brokers refuse the job's login or do not answer, and
    `TopicError` naming a missing main topic, or missing other topics when
    `kafka.create_topics` is off.
    """
    kafka = config.kafka
    admin = connected_admin(kafka.bootstrap_servers, kafka.client_options(), config.kafka_login())
    if isinstance(config, RouterConfig):
        return _prepare_router_topics(admin, config)
    main = partition_counts(admin, kafka.topics, pattern=kafka.topic_pattern)
    missing = [topic for topic in kafka.topics if topic not in main]
    if missing:
        raise TopicError(
            f"kafka.topics: topic(s) {missing} do not exist on {kafka.bootstrap_servers}"
        )
    if kafka.topic_pattern is not None:
        log.info("kafka.topic_pattern %r matches %d topic(s) now", kafka.topic_pattern, len(main))
    # A pattern job's tiers serve every topic it will match: as many partitions as the
    # largest one now (one when none matches yet).
    most = kafka.new_topics.partitions or max(main.values(), default=1)
    wanted = {
        topic: kafka.new_topics.partitions or main.get(key, most)
        for tier in config.retry.tiers
        for key, topic in tier.topics.items()
    }
    wanted.update({topic: most for topic in config.dead_letter.topics()})
    tier_configs = {
        topic: {TIER_TIMESTAMP_CONFIG: str(delay_ms + TIER_CLOCK_ALLOWANCE_MS)}
        for topic, delay_ms in config.retry.tier_delays_ms().items()
    }
    return _create_missing(admin, config, wanted, tier_configs)


def _create_missing(
    admin: AdminClient,
    config: AnyConfig,
    wanted: dict[str, int],
    optional_configs: dict[str, dict[str, str]] | None = None,
) -> dict[str, int]:
    """`ensure_topics` for `wanted` (topic -> partitions) with [kafka.new_topics]'s replication
    and configs, and for the control topic: one partition, the replication only
    (`NewTopics`). Returns the partition count of each of them."""
    kafka = config.kafka
    settings = kafka.new_topics
    topics = {**wanted, produced_topic(config.job.name): 1}
    ensure_topics(
        admin,
        topics,
        create=kafka.create_topics,
        configs=dict.fromkeys(wanted, settings.configs),
        optional_configs=optional_configs,
        replication_factor=settings.replication_factor,
    )
    return partition_counts(admin, topics)


def _prepare_router_topics(admin: AdminClient, config: RouterConfig) -> dict[str, int]:
    """`prepare_topics` of a delay router: its delay topics must exist (its users' producers
    write there); its fallback and control topics are created if allowed."""
    router = config.delay_router
    delays = partition_counts(admin, router.topics)
    missing = sorted(set(router.topics) - set(delays))
    if missing:
        raise TopicError(
            f"delay_router.topics: topic(s) {missing} do not exist on "
            f"{config.kafka.bootstrap_servers}; create them (the senders write there)"
        )
    wanted = {}
    if router.fallback_topic is not None:
        wanted[router.fallback_topic] = config.kafka.new_topics.partitions or max(delays.values())
    return _create_missing(admin, config, wanted)


def _read_kafka(spark: SparkSession, format_name: str, options: dict[str, str]) -> DataFrame:
    return spark.readStream.format(format_name).options(**options).load()


def source_options(config: AnyConfig) -> tuple[dict[str, str], dict[str, str]]:
    """The options of Spark's Kafka source for the main topics (Java client options) and of
    the retry tiers' `retrylib_kafka` source (librdkafka's).

    `kafka.max_offsets_per_trigger` bounds both, so a retry backlog is read in batches too.
    """
    kafka = config.kafka
    delays = config.delayed_topics()
    common = {
        "kafka.bootstrap.servers": kafka.bootstrap_servers,
        "failOnDataLoss": str(kafka.fail_on_data_loss).lower(),
    }
    if kafka.max_offsets_per_trigger:
        common["maxOffsetsPerTrigger"] = str(kafka.max_offsets_per_trigger)
    main = {
        **_client_options(reading_options(kafka.spark_options(), Reading.MAIN_TOPICS)),
        **common,
        **_subscription(kafka),
        **_starting_options(kafka),
    }
    if kafka.starting_timestamp_ms is not None:
        # A partition with no record from then on starts at its end, not fails the query.
        main["startingOffsetsByTimestampStrategy"] = "latest"
    tiers = {
        **_client_options(reading_options(kafka.client_options(), Reading.DELAYED_TOPICS)),
        **common,
        "subscribe": ",".join(sorted(delays)),
        "retrylib.topicDelaysMs": json.dumps(delays),
        "retrylib.readAheadMs": str(config.read_ahead_ms()),
        "retrylib.tierStampsAhead": str(config.stamps_delayed_topics_ahead()).lower(),
        "retrylib.secretOptions": json.dumps(config.secret_options()),
    }
    return main, tiers


def _subscription(kafka: KafkaConfig, *tiers: str) -> dict[str, str]:
    """The source options naming the main topics (or their pattern) and `tiers`."""
    topics = {"subscribe": ",".join([*kafka.topics, *tiers])} if kafka.topics or tiers else {}
    if kafka.topic_pattern is not None:
        topics["subscribePattern"] = kafka.topic_pattern
    return topics


def _starting_options(kafka: KafkaConfig) -> dict[str, str]:
    """Where a new query starts reading the main topics, in the options of both sources.

    From a time: on each partition the first record at or after it, or the partition's end
    when there is none.
    """
    if kafka.starting_timestamp_ms is None:
        return {"startingOffsets": kafka.starting_offsets}
    return {"startingTimestamp": str(kafka.starting_timestamp_ms)}


def _client_options(options: dict[str, str]) -> dict[str, str]:
    """Kafka client `options` as a Kafka source's "kafka."-prefixed options."""
    return {f"kafka.{key}": value for key, value in options.items()}


def _every_topic(config: AnyConfig) -> dict[str, str]:
    """One `retrylib_kafka` source's options for the main topics and the tiers together."""
    _, tiers = source_options(config)
    subscription = _subscription(config.kafka, *sorted(config.delayed_topics()))
    return {**tiers, **subscription, **_starting_options(config.kafka)}


def available_now_target(config: AnyConfig) -> Offsets:
    """Where an availableNow run of the job ends: every main topic partition's latest
    (committed) offset and every tier partition's delay frontier, now.

    Raises `TopicError` naming a topic that does not exist.
    """
    reader = KafkaStreamReader(parse_source_options(_every_topic(config)))
    try:
        return reader.available_end()
    finally:
        reader.stop()


def _held_to(options: dict[str, str], target: Offsets | None) -> dict[str, str]:
    """`options` of a `retrylib_kafka` source, told to read no further than `target`."""
    if target is None:
        return options
    topics = options.get("subscribe", "").split(",")
    pattern = options.get("subscribePattern")
    mine = {key: offset for key, offset in target.items() if subscribed(key[0], topics, pattern)}
    return {**options, OPTION_AVAILABLE_NOW_OFFSETS: json.dumps(offsets_to_json(mine))}


def source_frame(
    spark: SparkSession,
    config: AnyConfig,
    reader: str,
    range_groups: int,
    available_now_offsets: Offsets | None = None,
    breaker_file: Path | None = None,
    key_order: dict[str, object] | None = None,
) -> DataFrame:
    """Every topic the job reads: the main topics, and the retry tiers up to what is due.

    `reader` (`retrylib.source.main_reader`) "python": one `retrylib_kafka` source for all
    of them, emitting offset ranges (`retrylib.emit = ranges`) that the routing tasks read
    themselves: records skip the JVM, and `maxOffsetsPerTrigger` bounds a batch, retries
    included. "builtin": the main topics come from Spark's Kafka connector as records, in a
    union with one `retrylib_kafka` source for the tiers, emitting records too.
    `range_groups`: the input partitions of the python reader, one per executor core.
    `available_now_offsets` holds the `retrylib_kafka` source to them (an availableNow run
    on Spark 4.0/4.1); `breaker_file` holds its main topics while the breaker is open;
    `key_order` (`HandlerJob.key_order_option`) has it plan key groups with a key-ordered
    job's queues.
    """
    main, tiers = source_options(config)
    if reader == CONNECTOR:
        log.info("main topics read with Spark's built-in kafka source")
        frame = _read_kafka(spark, "kafka", {**main, "includeHeaders": "true"})
        if not config.delayed_topics():
            return frame
        return frame.unionByName(
            _read_kafka(spark, "retrylib_kafka", _held_to(tiers, available_now_offsets))
        )
    log.info("topics read with the retrylib_kafka Python data source")
    every_topic = {
        **_every_topic(config),
        "retrylib.emit": "ranges",
        # One input partition per core: Spark pays a Python round trip per input partition.
        "retrylib.rangeGroups": str(range_groups),
    }
    if breaker_file is not None:
        every_topic["retrylib.breakerFile"] = str(breaker_file)
    if key_order is not None:
        every_topic[OPTION_KEY_ORDER] = json.dumps(key_order)
    return _read_kafka(spark, "retrylib_kafka", _held_to(every_topic, available_now_offsets))


def task_plan(config: Config, partitions: dict[str, int], signing_key: bytes) -> TaskPlan:
    """A handler job's per-batch plan with batch id and clock still unset (the batch commit
    fills them in)."""
    retry = config.retry
    return TaskPlan(
        job=config.job.name,
        batch_id=-1,
        now_ms=0,
        handler=config.handler.function,
        handler_paths=config.handler.paths,
        handler_timeout_ms=config.handler.timeout_ms,
        output_schema=config.handler.output_schema.to_arrow(),
        dead_letter_topic=config.dead_letter.topic,
        retry_topics={
            key: tuple(tier.topics[key] for tier in retry.tiers)
            for key in config.kafka.topic_keys()
        },
        tier_delays_ms=retry.delays_ms,
        max_retry_after_ms=retry.max_retry_after_ms,
        retry_timeout_ms=retry.timeout_ms,
        dead_letter_routes=config.dead_letter.routes,
        signing_key=signing_key,
        partition_counts=partitions,
        max_attempts=retry.max_attempts,
        jitter=retry.jitter,
        non_retryable=retry.non_retryable,
        handler_kind=config.handler.kind,
        handler_parallelism=config.handler.parallelism,
        bootstrap_servers=config.kafka.bootstrap_servers,
        client_options=config.kafka.client_options(),
        secret_options=config.secret_options(),
        fail_on_data_loss=config.kafka.fail_on_data_loss,
        hooks=config.hooks.references(RECORD_HOOKS),
        key_ordered=retry.key_ordered,
        read_ahead_ms=retry.read_ahead_ms,
    )


def forward_plan(config: RouterConfig) -> ForwardPlan:
    """A delay router's per-batch plan, its clock still unset (the batch commit sets it)."""
    kafka, router = config.kafka, config.delay_router
    return ForwardPlan(
        job=config.job.name,
        delays_ms=router.topics,
        target_header=router.target_header,
        timestamp_header=router.timestamp_header,
        fallback_topic=router.fallback_topic,
        bootstrap_servers=kafka.bootstrap_servers,
        client_options=kafka.client_options(),
        secret_options=config.secret_options(),
        fail_on_data_loss=kafka.fail_on_data_loss,
        read_ahead_ms=router.read_ahead_ms,
        max_timestamp_ahead_ms=router.max_timestamp_ahead_ms,
    )


def record_limits(
    config: AnyConfig, partitions: dict[str, int]
) -> tuple[RecordLimits, dict[str, str]]:
    """The size limits of the topics retrylib produces to (looked up once now, so a topic
    that is too small stops the job before it starts), and the Kafka options of its
    producer: the job's, with a `batch.size` no topic's limit is below.

    Raises `TopicError` as `RecordLimits.current`, `ConfigError` for a Kafka option that
    is not a number.
    """
    kafka = config.kafka
    control = produced_topic(config.job.name)
    limits = RecordLimits(
        kafka.bootstrap_servers, kafka.client_options(), [t for t in partitions if t != control]
    )
    limits.current()
    options = kafka.client_options()
    if isinstance(config, RouterConfig):
        # Forwarded records are partitioned by key as Kafka's Java clients do it, unless
        # the user chose otherwise.
        options = {"partitioner": _JAVA_PARTITIONER, **options}
    batch_bytes = producer_batch_bytes(options, limits.topic_max)
    if batch_bytes is not None:
        log.info(
            "retry and dead-letter records produced in batches of at most %d bytes", batch_bytes
        )
        options["batch.size"] = str(batch_bytes)
    return limits, options


@dataclass(frozen=True)
class Prepared:
    """What a start needs before Spark: the job's topics, ready, and the runner lease."""

    partitions: dict[str, int]  # of every retry, dead-letter and control topic
    lease: RunnerLease


def prepare_to_run(config: AnyConfig) -> Prepared:
    """Prepare the job's topics (`prepare_topics`: a missing main topic is named first),
    then take the lease of its checkpoint (`retrylib.kafka.runner_lease`), held on its
    control topic. Raises `LeaseHeld` naming the copy that runs the job now."""
    partitions = prepare_topics(config)
    steps.reached("after_topics", steps.STARTING)
    kafka = config.kafka
    lease = take_lease(
        kafka.bootstrap_servers,
        kafka.client_options(),
        make_admin(kafka.bootstrap_servers, kafka.client_options()),
        topic=produced_topic(config.job.name),
        group=runner_group(config.job.name, config.job.checkpoint),
        what=f"job {config.job.name!r}",
    )
    steps.reached("after_lease", steps.STARTING)
    return Prepared(partitions, lease)


def start_query(
    spark: SparkSession,
    config: AnyConfig,
    *,
    available_now: bool = False,
    on_result: Callable[[BatchResult], None] | None = None,
    prepared: Prepared | None = None,
) -> tuple[StreamingQuery, BatchCommit]:
    """Prepare topics and tables, then start the streaming query; returns it and its `BatchCommit`.

    The topics and the job's runner lease (`prepare_to_run`) are `prepared` first when not
    given, before anything else is written; `batch_commit.close()` releases the lease. Every
    batch's metrics are logged, and
    stored when `[metrics] table` is set (`batch.metrics`); `on_result` is then called
    with the batch's `BatchResult` (in a classic session: a Spark Connect server ends the
    batches in a process of its own, so there `on_result` raises `RetrylibError`).
    """
    if prepared is None:
        prepared = prepare_to_run(config)
    try:
        return _start_prepared(spark, config, prepared, available_now, on_result)
    except BaseException:
        prepared.lease.release()
        raise


def _start_prepared(
    spark: SparkSession,
    config: AnyConfig,
    prepared: Prepared,
    available_now: bool,
    on_result: Callable[[BatchResult], None] | None,
) -> tuple[StreamingQuery, BatchCommit]:
    """`start_query` once the topics are ready and the lease is held."""
    connect = is_connect(spark)
    if connect and on_result is not None:
        raise RetrylibError(
            "on_result is called in the process that runs the batches, which a Spark Connect "
            "server runs: read the query's progress or the metrics table instead"
        )
    checkpoint = Checkpoint(config.job.checkpoint)
    position = checkpoint.check_offsets_log(spark)
    if not isinstance(config, RouterConfig):
        refuse_stranded_retries(config, position)
    reader = checkpoint.main_reader(
        spark, config.kafka.source, partial(builtin_kafka_available, spark)
    )
    steps.reached("after_main_reader", steps.STARTING)
    job = config if isinstance(config, RouterConfig) else _handler_job(config)
    app_id = checkpoint.app_id(spark, config.job.name)
    steps.reached("after_identity", steps.STARTING)
    signing_key = checkpoint.signing_key(spark)
    steps.reached("after_signing_key", steps.STARTING)
    make_tables = partial(_make_tables, spark, job) if isinstance(job, HandlerJob) else None
    if connect and make_tables is not None:
        # The server's batches run in a process of their own, which cannot wait for this
        # one's thread (`read_tables_ahead`): the tables are made before the query.
        make_tables()
    parts = BatchCommitParts(
        job=job,
        partitions=prepared.partitions,
        app_id=app_id,
        signing_key=signing_key,
        units=default_parallelism(spark),
    )
    batch_commit = make_batch_commit(
        parts, spark, on_result=on_result, lease=prepared.lease, runs_batches=not connect
    )
    try:
        if not connect:
            batch_commit.read_tables_ahead(spark, make_tables)
        query = _start_stream(spark, config, reader, parts, batch_commit, available_now)
    except BaseException:
        batch_commit.close()  # and with it what it started beside the batches
        raise
    return query, batch_commit


def _start_stream(
    spark: SparkSession,
    config: AnyConfig,
    reader: str,
    parts: BatchCommitParts,
    batch_commit: BatchCommit,
    available_now: bool,
) -> StreamingQuery:
    """Start the streaming query of `batch_commit`, made from `parts`, reading the main
    topics with `reader`."""
    connect = is_connect(spark)
    checkpoint = Checkpoint(config.job.checkpoint)
    # Spark 4.0/4.1 would run availableNow as one unbounded batch: there the job runs
    # back-to-back triggers instead, the tier source held to the target, until it is reached.
    target = None
    if available_now and not ENGINE_LIMITS_PYTHON_SOURCES:
        target = available_now_target(config)
        log.info("availableNow on Spark %s: up to %s", spark.version, offsets_to_json(target))
    breaker_file = key_order = None
    if isinstance(parts.job, HandlerJob):
        breaker_file, key_order = parts.job.breaker_file, parts.job.key_order_option()
    source = source_frame(spark, config, reader, parts.units, target, breaker_file, key_order)
    writer = (
        batch_commit.routed(source)
        .writeStream.queryName(config.job.name)
        .option("checkpointLocation", checkpoint.spark)
        # A Spark Connect server pickles the function and runs it in a Python process of its
        # own, which builds its own `BatchCommit` (its Kafka clients, threads, hooks) from the
        # parts.
        .foreachBatch(
            BatchFunction(partial(_batch_commit_on_server, parts)) if connect else batch_commit
        )
    )
    if target is not None:
        writer = writer.trigger(processingTime="0 seconds")
    elif available_now:
        writer = writer.trigger(availableNow=True)
    else:
        writer = writer.trigger(processingTime=f"{config.job.trigger_ms} milliseconds")
    query = writer.start()
    steps.reached("after_query_start", steps.STARTING)
    if connect:
        batch_commit.follow(query)
    if target is not None:
        threading.Thread(
            target=_stop_at_target,
            args=(query, batch_commit, target),
            name=f"retrylib-available-now-{config.job.name}",
            daemon=True,
        ).start()
    return query


@dataclass(frozen=True)
class HandlerJob:
    """A handler job's config with what its batch commit needs beyond a delay router's: its
    output and dead-letter tables (`_make_tables` makes them), and the files its source reads
    the breaker's state and the key queues from (local files on the Spark driver, fresh for
    each run)."""

    config: Config
    output: TableRef
    dead_letter: TableRef
    breaker_file: Path | None
    key_state_file: Path | None

    def key_order_option(self) -> dict[str, object] | None:
        """The `retrylib_kafka` source's key-order option (`source_frame`) of a key-ordered
        job: each main topic's tiers, and the file of the queues (`batch.key_order_store`)."""
        if self.key_state_file is None:
            return None
        tiers = self.config.retry.tiers
        return {
            "tiers": {
                key: [tier.topics[key] for tier in tiers] for key in self.config.kafka.topic_keys()
            },
            "stateFile": str(self.key_state_file),
        }


def _handler_job(config: Config) -> HandlerJob:
    """The handler job of `config`: its tables named (`_make_tables` makes them), its state
    files too."""
    return HandlerJob(
        config, config.output.table_ref(), config.dead_letter.table_ref(), *_state_files(config)
    )


def _make_tables(spark: SparkSession, job: HandlerJob) -> None:
    """Create `job`'s output and dead-letter tables if missing; check their columns."""
    config = job.config
    ensure_table(
        spark,
        job.output,
        config.handler.output_schema.to_spark(),
        what="output",
        partition_by=config.output.partition_by,
        properties=config.output.properties,
        evolve=config.output.schema_evolution,
    )
    ensure_table(spark, job.dead_letter, dead_letter_struct(), what="dead-letter")


def _state_files(config: Config) -> tuple[Path | None, Path | None]:
    """The files of the breaker's state and of the key queues, for a job that has either, in
    a folder made for this run."""
    if config.breaker is None and not config.retry.key_ordered:
        return None, None
    folder = Path(tempfile.mkdtemp(prefix=f"retrylib-{config.job.name}-"))
    return (
        folder / "breaker.json" if config.breaker is not None else None,
        folder / "key_order.json" if config.retry.key_ordered else None,
    )


@dataclass(frozen=True)
class BatchCommitParts:
    """What a job's `BatchCommit` is built from once the topics, tables and checkpoint are
    ready: plain values, which a Spark Connect server unpickles to build its own."""

    job: HandlerJob | RouterConfig
    partitions: dict[str, int]  # of every retry, dead-letter and control topic
    app_id: str
    signing_key: bytes
    units: int  # the routing tasks of a batch, one per executor core

    @property
    def config(self) -> AnyConfig:
        return self.job if isinstance(self.job, RouterConfig) else self.job.config


def _batch_commit_on_server(parts: BatchCommitParts, spark: SparkSession) -> BatchCommit:
    """`make_batch_commit` in the Python process a Spark Connect server runs the batches in: its
    log lines go to that process's stderr (the server's log), the config's secrets masked."""
    configure_worker_logging()
    redact_secrets(parts.config.secret_values())
    return make_batch_commit(parts, spark)


def make_batch_commit(
    parts: BatchCommitParts,
    spark: SparkSession,
    *,
    on_result: Callable[[BatchResult], None] | None = None,
    lease: RunnerLease | None = None,
    runs_batches: bool = True,
) -> BatchCommit:
    """The job's `BatchCommit`, with its metrics and record limits, and a handler job's
    breaker, key queues, hooks and compaction, for batches run through `spark`; `lease` is
    released by its `close()`. `runs_batches` is false for a Spark Connect client's, which
    only builds the query's frame: the server's own one has the breaker and watches
    `[breaker] health`."""
    config = parts.config
    limits, producer_options = record_limits(config, parts.partitions)
    checkpoint = Checkpoint(config.job.checkpoint)
    commit = partial(
        BatchCommit,
        checkpoint=checkpoint,
        app_id=parts.app_id,
        kafka_options=producer_options,
        bootstrap_servers=config.kafka.bootstrap_servers,
        signing_key=parts.signing_key,
        reader_options=config.kafka.client_options(),
        secret_options=tuple(config.secret_options()),
        record_limits=limits,
        units=parts.units,
        later_tables=tuple(filter(None, [config.metrics.table_ref()])),
        lease=lease,
    )
    if isinstance(parts.job, RouterConfig):
        metrics = MetricsRecorder(parts.job, parts.app_id, (), forward=on_result)
        metrics.prepare(spark)
        return commit(
            forward_plan(parts.job), task=run_forwarding_task, on_result=metrics.on_result
        )
    plan = task_plan(parts.job.config, parts.partitions, parts.signing_key)
    return _handler_batch_commit(
        commit, checkpoint, plan, parts.job, parts.app_id, spark, on_result, runs_batches
    )


def _handler_batch_commit(
    commit: Callable[..., BatchCommit],
    checkpoint: Checkpoint,
    plan: TaskPlan,
    job: HandlerJob,
    app_id: str,
    spark: SparkSession,
    on_result: Callable[[BatchResult], None] | None,
    runs_batches: bool,
) -> BatchCommit:
    """`make_batch_commit` of a handler job: `commit` given `plan`, the tables and the rest;
    the breaker, key queues and compaction keep their state in `checkpoint`."""
    config = job.config
    breaker = None  # a Spark Connect client's commit runs no batch: the server's has it
    if runs_batches and job.breaker_file is not None and config.breaker is not None:
        breaker = Breaker(
            config.breaker,
            job.breaker_file,
            on_change=partial(_publish_breaker, spark, checkpoint.breaker),
        )
    key_order = None
    if job.key_state_file is not None:
        key_order = KeyOrderStore(checkpoint.key_order, job.key_state_file)
        key_order.load(spark)
    metrics = MetricsRecorder(
        config,
        app_id,
        config.retry.tiers,
        forward=on_result,
        breaker=breaker,
        dead_letters=job.dead_letter,
    )
    metrics.prepare(spark)
    compactor = None
    if config.output.optimize_every_ms is not None:
        tables = [("output", job.output), ("dead-letter", job.dead_letter)]
        if config.metrics.table_ref() is not None:
            tables.append(("metrics", config.metrics.table_ref()))
        compactor = Compactor(checkpoint.compaction, config.output.optimize_every_ms, tables)
    batch_commit = commit(
        plan,
        output_table=job.output,
        evolve_output=config.output.schema_evolution,
        dead_letter_table=job.dead_letter,
        retry_tiers=len(config.retry.tiers),
        on_result=(
            metrics.on_result
            if breaker is None
            else partial(_feed_breaker, breaker, metrics.on_result)
        ),
        compactor=compactor,
        hooks=config.hooks.references(BATCH_HOOKS),
        hook_timeout_s=config.hooks.timeout_ms / 1000,
        hook_paths=config.handler.paths,
        task=run_task,
        key_order=key_order,
    )
    if breaker is not None:
        _watch_health(batch_commit, breaker, config.handler.paths)
    return batch_commit


def _watch_health(batch_commit: BatchCommit, breaker: Breaker, paths: tuple[str, ...]) -> None:
    """Start asking the breaker's `health` function, if it has one, until `batch_commit`
    closes."""
    health = breaker.config.health
    if health is None:
        return
    watch = HealthWatch(
        import_object(health, paths),  # type: ignore[arg-type]
        breaker.config.health_every_ms / 1000,
        breaker.config.health_timeout_ms / 1000,
        breaker,
    )
    batch_commit.on_close(watch.start().stop)


def _release_taken(preparing: Future[Prepared]) -> None:
    if preparing.exception() is None:
        preparing.result().lease.release()


def _feed_breaker(
    breaker: Breaker, then: Callable[[BatchResult], None], result: BatchResult
) -> None:
    """Give the breaker a batch's main-topic outcomes, then pass the result on: the metrics
    line then shows the state the batch left."""
    counters = result.counters
    breaker.after_batch(
        counters.get(Count.RECORDS_MAIN, 0),
        counters.get(Count.MAIN_FAILED, 0),
        int(time.time() * 1000),
    )
    then(result)


def _publish_breaker(spark: SparkSession, uri: str, state: BreakerState, why: str) -> None:
    """Put the breaker's new `state` in the checkpoint, for `retrylib status`."""
    now_ms = int(time.time() * 1000)
    probe_at = state.probe_at_ms if state.phase == OPEN else None
    replace_json(
        spark,
        uri,
        {
            "state": state.phase,
            "paused": state.paused,
            "since_ms": now_ms,
            "why": why,
            "probe_at_ms": probe_at,
        },
    )


def _stop_at_target(query: StreamingQuery, batch_commit: BatchCommit, target: Offsets) -> None:
    """Stop `query` once a finished batch has read up to `target` in every partition, or a
    trigger found nothing to read (every source is at its target or has nothing new)."""
    while query.isActive:
        progress = query.lastProgress
        status = query.status
        idle = not status.get("isDataAvailable") and status.get("message") == _IDLE_MESSAGE
        if idle or (progress is not None and reached(progress_end_offsets(progress.json), target)):
            log.info("availableNow: everything up to the target is processed; stopping")
            stop_gracefully(query, batch_commit)
            return
        time.sleep(0.1)


def stop_gracefully(
    query: StreamingQuery,
    batch_commit: BatchCommit,
    timeout: float = _STOP_WAIT_SECONDS,
    cancel_batch: Callable[[], None] | None = None,
) -> bool:
    """Stop `query` once the batch running now (if any) has done its work and Spark has
    recorded it as done, within `timeout`; returns whether a batch was cut short.

    A batch Spark did not record as done (the bound passed) is replayed on restart, which
    reuses its manifest and commits nothing twice. Past the bound, `cancel_batch` (when
    given) cancels the batch's Spark jobs, and the stop waits for the batch to end with
    them: the query then ends failed by that cancellation. Without it, `query.stop()`
    interrupts Spark's stream thread inside the batch function, which a hung handler's
    batch answers with its traceback and a JVM stack overflow in the log. One line says
    where it stopped, and whether a batch was cut short.
    """
    batch_commit.batch_finished.clear()
    deadline = time.monotonic() + timeout
    finished = False
    while query.isActive and query.status.get("isTriggerActive"):
        finished = batch_commit.batch_finished.wait(0.05)
        if finished or time.monotonic() >= deadline:
            break
    if finished:
        # Past the batch commit's end of the batch Spark writes its commit log; a stop then
        # interrupts that write and leaves the batch to be replayed.
        while not _recorded_done(query, batch_commit.last_finished) and time.monotonic() < deadline:
            time.sleep(0.02)
    cut_short = bool(not finished and query.isActive and query.status.get("isTriggerActive"))
    if cut_short and cancel_batch is not None:
        cancel_batch()
        ends = time.monotonic() + _CANCELLED_BATCH_WAIT_SECONDS
        while query.isActive and time.monotonic() < ends:
            time.sleep(0.05)
    query.stop()
    done = (
        "no batch" if batch_commit.last_finished is None else f"batch {batch_commit.last_finished}"
    )
    if cut_short:
        log.warning(
            "stopped after %s; the batch running did not finish within %gs and runs again "
            "at the next start, committing nothing twice",
            done,
            timeout,
        )
    else:
        log.info("stopped after %s; the next start goes on from there", done)
    return cut_short


def _cancel_jobs(spark: SparkSession) -> None:
    """Cancel every Spark job this session runs (a batch's, at a stop past its bound).

    What the cancelled tasks and Spark's call into the batch function then log, each a stack
    trace of the cancellation (some 270 lines), is left out: the stop's warning says it.
    """
    log4j = spark.sparkContext._jvm.org.apache.logging.log4j  # type: ignore[union-attr]
    # Every logger, not only the root that setLogLevel sets: some have levels of their own.
    log4j.core.config.Configurator.setAllLevels("", log4j.Level.FATAL)
    logging.getLogger("py4j.clientserver").setLevel(logging.CRITICAL)
    spark.sparkContext.cancelAllJobs()


def _recorded_done(query: StreamingQuery, batch_id: int) -> bool:
    """Whether Spark has recorded batch `batch_id` as done (its progress is reported after
    its commit log is written), or `query` is no longer running."""
    if not query.isActive:
        return True
    progress = query.lastProgress
    return progress is not None and progress.batchId >= batch_id


def run(config: AnyConfig, *, available_now: bool = False, master: str | None = None) -> int:
    """Run the job until it finishes (available-now), fails, or gets SIGTERM/SIGINT.

    Returns the process exit code: 0 when it finished or was stopped, 1 when the query
    failed (the error is logged). Raises the `RetrylibError` that failed a batch when
    retrylib detected it itself (`TableWriteError`, ...), and Spark's error when the query
    failed otherwise. Raises `LeaseHeld` when another copy runs the job from the same
    checkpoint (at start, or when it took the lease over while the brokers did not hear
    from this one).

    A script of yours, run with `python` or `spark-submit`, runs a job so. The last line is
    not run by the doctests (`+SKIP`): it starts Spark and a query that runs until stopped.

    >>> import sys
    >>> from retrylib import load_config, run
    >>> sys.exit(run(load_config("job.toml")))  # doctest: +SKIP
    """
    redact_secrets(config.secret_values())
    # Topics and lease are made ready while Spark starts: a group's first rebalance waits
    # for the broker's group.initial.rebalance.delay.ms (3 s by default).
    with ThreadPoolExecutor(1, thread_name_prefix="retrylib-prepare") as pool:
        preparing = pool.submit(prepare_to_run, config)
        try:
            spark = build_spark_session(
                f"retrylib-{config.job.name}", master=master, extra=spark_log_conf()
            )
            ship_code(spark, config)
        except BaseException:
            preparing.add_done_callback(_release_taken)
            raise
        prepared = preparing.result()
    lease = prepared.lease
    with stop_requests(spark) as stop_requested:
        query, batch_commit = start_query(
            spark, config, available_now=available_now, prepared=prepared
        )
        try:
            try:
                while (
                    query.isActive and not stop_requested.is_set() and not lease.taken_over.is_set()
                ):
                    query.awaitTermination(0.5)
            except Exception as error:  # the query failed: Spark's wrapping of what failed it
                # Raised outside this process's batch function: in the batch on a Connect
                # server, or in the retrylib_kafka source (Spark runs it in a Python worker).
                if batch_commit.failure is None:
                    batch_commit.failure = task_error(error) or no_space_error(error)
                if batch_commit.failure is None:
                    raise
            if batch_commit.failure is not None:
                raise batch_commit.failure
            batch_commit.tables_made()
            stop = partial(
                stop_gracefully,
                query,
                batch_commit,
                config.job.stop_timeout_ms / 1000,
                None if is_connect(spark) else partial(_cancel_jobs, spark),
            )
            if lease.taken_over.is_set():
                stop()
                raise LeaseHeld(
                    f"job {config.job.name!r}: another copy took the lease {lease.group} while "
                    "the brokers did not hear from this one; this copy stopped"
                )
            if stop_requested.is_set() and stop():
                return 0  # the batch cut short ended failed by its cancellation; it runs again
            error = query.exception()
            if error is not None:
                log.error("query %s failed: %s", config.job.name, error)
                return 1
            return 0
        finally:
            batch_commit.close()
