"""A delay router: each record on a delay topic forwarded, once its delay has passed, to the
topic its header names; no handler, tables, retries or dead letters. Its topics, task plan
and batch commit, and how `status` and `check` show it."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from confluent_kafka.admin import AdminClient
from pyspark.sql import SparkSession
from pyspark.sql.types import StructType

from retrylib.batch.commit import BatchCommit, BatchUpkeep
from retrylib.batch.metrics import MetricsRecorder
from retrylib.batch.result import BatchResult
from retrylib.batch.routing_stage import Routing
from retrylib.config.described import describe_router
from retrylib.config.durations import format_duration
from retrylib.config.model import BreakerConfig, DeadLetterConfig, DelayRouterJobConfig, RetryTier
from retrylib.config.table_ref import TableRef
from retrylib.errors import TopicError
from retrylib.job.topics import create_missing
from retrylib.kafka.clients import partition_counts
from retrylib.kafka.offsets import PartitionKey
from retrylib.retry.outcomes import Count, ForwardCount
from retrylib.task.forwarding import ForwardPlan, run_forwarding_task

_JAVA_PARTITIONER = "murmur2_random"  # librdkafka's name for the Java clients' partitioner


@dataclass(frozen=True)
class DelayRouterJob:
    """A delay router's config: what its job does differently from a handler job's."""

    config: DelayRouterJobConfig

    retries: ClassVar[bool] = False  # a record not yet due waits in its delay topic
    tiers_shown_as: ClassVar[str] = "delay_topics"  # `status`'s key for `shown_tiers`
    batch_counts: ClassVar[tuple[str, ...]] = (
        ForwardCount.RECORDS_DELAYED,
        ForwardCount.FORWARDED,
        Count.REQUEUED_NOT_DUE,
        ForwardCount.FORWARDED_TO_FALLBACK,
        ForwardCount.UNROUTABLE,
    )
    """The record counts `status` gives for each batch, in the order it shows them."""
    # No dead letters, breaker, key queues or state files: what a handler job may have.
    dead_letter: ClassVar[DeadLetterConfig | None] = None
    breaker: ClassVar[BreakerConfig | None] = None
    key_ordered: ClassVar[bool] = False
    breaker_file: ClassVar[Path | None] = None

    def for_run(self) -> DelayRouterJob:
        """This job as a run uses it: a delay router keeps no files of its own."""
        return self

    def prepare_topics(self, admin: AdminClient) -> dict[str, int]:
        """`start.prepare_topics` of a delay router: its delay topics must exist (its users'
        producers write there); its fallback and control topics are created if allowed."""
        config = self.config
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
            wanted[router.fallback_topic] = config.kafka.new_topics.partitions or max(
                delays.values()
            )
        return create_missing(admin, config, wanted)

    def producer_options(self, options: dict[str, str]) -> dict[str, str]:
        """The Kafka options of the job's producer, from the job's client `options`."""
        # Forwarded records are partitioned by key as Kafka's Java clients do it, unless
        # the user chose otherwise.
        return {"partitioner": _JAVA_PARTITIONER, **options}

    def refuse_stranded(self, position: Mapping[PartitionKey, int]) -> None:
        """Nothing to refuse: a delay router has no retry topics to leave records in."""

    def table_maker(self, spark: SparkSession) -> Callable[[], None] | None:
        """None: a delay router writes no table but its metrics."""
        return None

    def key_order_option(self) -> dict[str, object] | None:
        """None: a delay router forwards each record when due, whatever its key."""
        return None

    def batch_commit(
        self,
        commit: Callable[..., BatchCommit],
        app_id: str,
        partitions: dict[str, int],
        signing_key: bytes,
        spark: SparkSession,
        on_result: Callable[[BatchResult], None] | None,
        runs_batches: bool,
    ) -> BatchCommit:
        """`batch_commit.make_batch_commit` of a delay router: `commit` (a `BatchCommit` given
        what every job's is) with the forwarding task and its plan, and the metrics; its one
        effect is the Kafka produce every job's commit has."""
        metrics = MetricsRecorder(self.config, app_id, (), forward=on_result)
        metrics.prepare(spark)
        return commit(
            Routing(run_forwarding_task, forward_plan(self.config)),
            upkeep=BatchUpkeep(on_result=metrics.on_result),
        )

    def shown_tiers(self) -> list[RetryTier]:
        """The topics `status` counts as tiers: each delay topic a tier of its own."""
        return [
            RetryTier(index, delay_ms, {topic: topic})
            for index, (topic, delay_ms) in enumerate(self.config.delay_router.topics.items())
        ]

    def required_topics(self) -> list[tuple[str, str, str]]:
        """(topic, label, config key) of each topic that must exist before the job starts:
        the delay topics."""
        return [
            (
                topic,
                f"delay topic {topic!r} ({format_duration(delay)})",
                f"delay_router.topics.{topic}",
            )
            for topic, delay in self.config.delay_router.topics.items()
        ]

    def created_topics(self) -> list[tuple[str, str]]:
        """(topic, label) of each topic the job creates when missing (if allowed), beside
        its control topic: the fallback topic."""
        fallback = self.config.delay_router.fallback_topic
        return [] if fallback is None else [(fallback, f"fallback topic {fallback!r}")]

    def tables(self) -> list[tuple[str, TableRef, StructType]]:
        """None: beside its metrics table, a delay router writes no table."""
        return []

    def describe(self) -> list[str]:
        """What the job does, as `retrylib check` prints it."""
        return [describe_router(self.config.delay_router)]


def forward_plan(config: DelayRouterJobConfig) -> ForwardPlan:
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
