"""Starting a job's streaming query: its topics made ready and its runner lease taken (while
Spark starts), the lease made sure of once Spark tells where the checkpoint is, then its
checkpoint read, and the query started while its tables are made and the executors' Python
workers start."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

from pyspark.sql import SparkSession
from pyspark.sql.streaming import StreamingQuery

from retrylib import steps
from retrylib.batch.commit import BatchCommit, BatchFunction
from retrylib.batch.result import BatchResult
from retrylib.config.model import AnyConfig
from retrylib.config.topic_names import produced_topic
from retrylib.errors import RetrylibError
from retrylib.job.batch_commit import BatchCommitParts, batch_commit_on_server, make_batch_commit
from retrylib.job.kinds import kind_of
from retrylib.job.python_workers import start_python_workers
from retrylib.job.source_frame import available_now_target, builtin_kafka_available, source_frame
from retrylib.job.stopping import stop_at_target
from retrylib.kafka.clients import connected_admin, make_admin
from retrylib.kafka.offsets import offsets_to_json
from retrylib.kafka.runner_lease import RunnerLease, runner_group, take_lease
from retrylib.source.kafka_source import ENGINE_LIMITS_PYTHON_SOURCES
from retrylib.spark.flavour import flavour_of
from retrylib.state.checkpoint import Checkpoint

log = logging.getLogger(__name__)


def prepare_topics(config: AnyConfig) -> dict[str, int]:
    """Check the main topics (a delay router's: its delay topics); create missing retry,
    dead-letter (a delay router's: fallback) and control topics if allowed.

    Returns the partition count of every retry and dead-letter topic. Raises
    `KafkaConnectError` when the brokers refuse the job's login or do not answer, and
    `TopicError` naming a missing main topic, or missing other topics when
    `kafka.create_topics` is off.
    """
    kafka = config.kafka
    admin = connected_admin(kafka.bootstrap_servers, kafka.client_options(), config.kafka_login())
    return kind_of(config).prepare_topics(admin)


@dataclass(frozen=True)
class Prepared:
    """What a start needs before Spark: the job's topics, ready, and the runner lease of the
    checkpoint as its spelling tells (`lease_of_place` makes sure of it once Spark runs)."""

    partitions: dict[str, int]  # of every retry, dead-letter and control topic
    lease: RunnerLease


def prepare_to_run(config: AnyConfig) -> Prepared:
    """Prepare the job's topics (`prepare_topics`: a missing main topic is named first),
    then take the lease of its checkpoint (`retrylib.kafka.runner_lease`), held on its
    control topic, keyed on the checkpoint's place as far as its spelling tells. Raises
    `LeaseHeld` naming the copy that runs the job now."""
    partitions = prepare_topics(config)
    steps.reached("after_topics", steps.STARTING)
    lease = take_runner_lease(config, config.job.checkpoint, f"job {config.job.name!r}")
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
    lease = prepared.lease
    try:
        lease = lease_of_place(spark, config, lease)
        return _start_prepared(spark, config, prepared.partitions, lease, available_now, on_result)
    except BaseException:
        lease.release()
        prepared.lease.release()
        raise


def lease_of_place(spark: SparkSession, config: AnyConfig, lease: RunnerLease) -> RunnerLease:
    """The runner lease of the place the checkpoint is, as Spark's file system names it, before
    anything in the checkpoint is read or written: `lease` itself when its spelling already
    told that place, else that place's lease, taken before `lease` is let go.

    A plain path on a cluster whose default file system is HDFS, or a spelling its Hadoop
    names otherwise, costs the start this second lease's rebalance. Raises `LeaseHeld` when
    another copy runs from the same place under another spelling.
    """
    place = Checkpoint(config.job.checkpoint).place(spark)
    if runner_group(config.job.name, place) == lease.group:
        return lease
    log.info("the checkpoint %s is at %s: taking that place's lease", config.job.checkpoint, place)
    place_lease = take_runner_lease(config, place, lease.what)
    lease.release()
    return place_lease


def take_runner_lease(config: AnyConfig, checkpoint: str, what: str) -> RunnerLease:
    """The job's runner lease for the checkpoint at `checkpoint`, held on its control topic
    by `what` (how the holder names itself: the job, or a redrive that must run alone)."""
    kafka = config.kafka
    return take_lease(
        kafka.bootstrap_servers,
        kafka.client_options(),
        make_admin(kafka.bootstrap_servers, kafka.client_options()),
        topic=produced_topic(config.job.name),
        group=runner_group(config.job.name, checkpoint),
        what=what,
    )


def _start_prepared(
    spark: SparkSession,
    config: AnyConfig,
    partitions: dict[str, int],
    lease: RunnerLease,
    available_now: bool,
    on_result: Callable[[BatchResult], None] | None,
) -> tuple[StreamingQuery, BatchCommit]:
    """`start_query` once the topics are ready and the lease is held."""
    runs_batches = flavour_of(spark).runs_batches_here
    if not runs_batches and on_result is not None:
        raise RetrylibError(
            "on_result is called in the process that runs the batches, which a Spark Connect "
            "server runs: read the query's progress or the metrics table instead"
        )
    checkpoint = Checkpoint(config.job.checkpoint)
    for uri in checkpoint.remove_unfinished_spark_log_files(spark):
        log.warning("removed %s: Spark was writing it when the job last stopped", uri)
    position = checkpoint.check_offsets_log(spark)
    kind = kind_of(config)
    kind.refuse_stranded(position)
    reader = checkpoint.main_reader(
        spark, config.kafka.source, partial(builtin_kafka_available, spark)
    )
    steps.reached("after_main_reader", steps.STARTING)
    job = kind.for_run()
    app_id = checkpoint.app_id(spark, config.job.name)
    steps.reached("after_identity", steps.STARTING)
    signing_key = checkpoint.signing_key(spark)
    steps.reached("after_signing_key", steps.STARTING)
    make_tables = job.table_maker(spark)
    if not runs_batches and make_tables is not None:
        # The server's batches run in a process of their own, which cannot wait for this
        # one's thread (`read_tables_ahead`): the tables are made before the query.
        make_tables()
    parts = BatchCommitParts(
        job=job,
        partitions=partitions,
        app_id=app_id,
        signing_key=signing_key,
        units=flavour_of(spark).default_parallelism(spark),
    )
    batch_commit = make_batch_commit(
        parts, spark, on_result=on_result, lease=lease, runs_batches=runs_batches
    )
    try:
        if runs_batches:
            start_python_workers(spark, parts.units)
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
    runs_batches = flavour_of(spark).runs_batches_here
    checkpoint = Checkpoint(config.job.checkpoint)
    # Spark 4.0/4.1 would run availableNow as one unbounded batch: there the job runs
    # back-to-back triggers instead, the tier source held to the target, until it is reached.
    target = None
    if available_now and not ENGINE_LIMITS_PYTHON_SOURCES:
        target = available_now_target(config)
        log.info("availableNow on Spark %s: up to %s", spark.version, offsets_to_json(target))
    job = parts.job
    source = source_frame(
        spark, config, reader, parts.units, target, job.breaker_file, job.key_order_option()
    )
    writer = (
        batch_commit.routed(source)
        .writeStream.queryName(config.job.name)
        .option("checkpointLocation", checkpoint.spark)
        # A Spark Connect server pickles the function and runs it in a Python process of its
        # own, which builds its own `BatchCommit` (its Kafka clients, threads, hooks) from the
        # parts.
        .foreachBatch(
            batch_commit if runs_batches else BatchFunction(partial(batch_commit_on_server, parts))
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
    if not runs_batches:
        batch_commit.follow(query)
    if target is not None:
        threading.Thread(
            target=stop_at_target,
            args=(query, batch_commit, target),
            name=f"retrylib-available-now-{config.job.name}",
            daemon=True,
        ).start()
    return query
