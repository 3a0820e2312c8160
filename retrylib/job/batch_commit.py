"""Building a job's `BatchCommit` (its `foreachBatch` function) from plain parts: in this
process, or in the one a Spark Connect server runs the batches in."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

from pyspark.sql import SparkSession

from retrylib.batch.commit import BatchCommit
from retrylib.batch.produce_units import KafkaProduce
from retrylib.batch.result import BatchResult
from retrylib.batch.routing_stage import Staging
from retrylib.config.model import AnyConfig
from retrylib.config.topic_names import produced_topic
from retrylib.job.kinds import JobKind
from retrylib.kafka.clients import RecordLimits
from retrylib.kafka.record_size import producer_batch_bytes
from retrylib.kafka.runner_lease import RunnerLease
from retrylib.logs import configure_worker_logging, redact_secrets
from retrylib.sinks.produce_units import ProducerSettings
from retrylib.state.checkpoint import Checkpoint

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BatchCommitParts:
    """What a job's `BatchCommit` is built from once the topics, tables and checkpoint are
    ready: plain values, which a Spark Connect server unpickles to build its own."""

    job: JobKind
    partitions: dict[str, int]  # of every retry, dead-letter and control topic
    app_id: str
    signing_key: bytes
    units: int  # the routing tasks of a batch, one per executor core

    @property
    def config(self) -> AnyConfig:
        return self.job.config


def batch_commit_on_server(parts: BatchCommitParts, spark: SparkSession) -> BatchCommit:
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
    limits, producer_options = record_limits(parts.job, parts.partitions)
    commit = partial(
        BatchCommit,
        staging=Staging(Checkpoint(config.job.checkpoint), limits, parts.units),
        produce=KafkaProduce(
            ProducerSettings(
                job=config.job.name,
                app_id=parts.app_id,
                bootstrap_servers=config.kafka.bootstrap_servers,
                options=producer_options,
                reader_options=config.kafka.client_options(),
                signing_key=parts.signing_key,
                secret_options=tuple(config.secret_options()),
                topic_max_bytes=dict(limits.topic_max),
            )
        ),
        later_tables=tuple(filter(None, [config.metrics.table_ref()])),
        lease=lease,
    )
    return parts.job.batch_commit(
        commit, parts.app_id, parts.partitions, parts.signing_key, spark, on_result, runs_batches
    )


def record_limits(job: JobKind, partitions: dict[str, int]) -> tuple[RecordLimits, dict[str, str]]:
    """The size limits of the topics retrylib produces to (looked up once now, so a topic
    that is too small stops the job before it starts), and the Kafka options of its
    producer: the job's, with a `batch.size` no topic's limit is below.

    Raises `TopicError` as `RecordLimits.current`, `ConfigError` for a Kafka option that
    is not a number.
    """
    config = job.config
    kafka = config.kafka
    control = produced_topic(config.job.name)
    limits = RecordLimits(
        kafka.bootstrap_servers, kafka.client_options(), [t for t in partitions if t != control]
    )
    limits.current()
    options = job.producer_options(kafka.client_options())
    batch_bytes = producer_batch_bytes(options, limits.topic_max)
    if batch_bytes is not None:
        log.info(
            "retry and dead-letter records produced in batches of at most %d bytes", batch_bytes
        )
        options["batch.size"] = str(batch_bytes)
    return limits, options
