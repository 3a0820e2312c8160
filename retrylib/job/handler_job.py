"""A handler job: every record to the user's handler, failures through retry tiers to dead
letters, output and dead letters appended to Delta. What such a job has that a delay router
has not: its topics, task plan, tables, breaker and key queues, and how `status` and
`check` show it."""

from __future__ import annotations

import logging
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import ClassVar

from confluent_kafka.admin import AdminClient
from pyspark.sql import SparkSession
from pyspark.sql.types import StructType

from retrylib.batch.commit import BatchCommit, BatchHooks, BatchUpkeep
from retrylib.batch.health_watch import HealthWatch
from retrylib.batch.key_order_store import KeyOrderStore
from retrylib.batch.metrics import MetricsRecorder
from retrylib.batch.result import BatchResult
from retrylib.batch.routing_stage import Routing
from retrylib.batch.table_appends import TableAppend
from retrylib.config.described import describe_handler_job
from retrylib.config.durations import format_duration
from retrylib.config.importing import import_object
from retrylib.config.model import (
    BATCH_HOOKS,
    RECORD_HOOKS,
    TIER_TIMESTAMP_CONFIG,
    BreakerConfig,
    Config,
    DeadLetterConfig,
    RetryTier,
)
from retrylib.config.table_ref import TableRef
from retrylib.config.topic_names import ANY_TOPIC
from retrylib.errors import TopicError
from retrylib.job.topics import TIER_CLOCK_ALLOWANCE_MS, create_missing
from retrylib.kafka.clients import partition_counts
from retrylib.kafka.offsets import PartitionKey
from retrylib.retry.breaker import OPEN, Breaker, BreakerState
from retrylib.retry.outcomes import Count
from retrylib.sinks.compaction import Compactor
from retrylib.sinks.dead_letter import dead_letter_struct
from retrylib.sinks.tables import ensure_table
from retrylib.source.stranded import refuse_stranded_retries
from retrylib.state.checkpoint import Checkpoint
from retrylib.state.files import replace_json
from retrylib.task.plan import TaskPlan
from retrylib.task.routing import run_task

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class HandlerJob:
    """A handler job's config, and for a run (`for_run`) the files its source reads the
    breaker's state and the key queues from (local files on the Spark driver, fresh for
    each run)."""

    config: Config
    breaker_file: Path | None = None
    key_state_file: Path | None = None

    retries: ClassVar[bool] = True  # failed records wait in retry tiers
    tiers_shown_as: ClassVar[str] = "retry_tiers"  # `status`'s key for `shown_tiers`
    batch_counts: ClassVar[tuple[str, ...]] = (
        Count.RECORDS_MAIN,
        Count.RECORDS_RETRY,
        Count.SUCCEEDED,
        Count.RETRIED,
        Count.DEAD_LETTERED,
        Count.DUPLICATES_SKIPPED,
    )
    """The record counts `status` gives for each batch, in the order it shows them."""

    @property
    def output_table(self) -> TableRef:
        return self.config.output.table_ref()

    @property
    def dead_letter_table(self) -> TableRef:
        return self.config.dead_letter.table_ref()

    @property
    def dead_letter(self) -> DeadLetterConfig:
        return self.config.dead_letter

    @property
    def breaker(self) -> BreakerConfig | None:
        return self.config.breaker

    @property
    def key_ordered(self) -> bool:
        return self.config.retry.key_ordered

    def for_run(self) -> HandlerJob:
        """This job with the files of its breaker's state and key queues, when it has
        either, in a folder made for this run."""
        return HandlerJob(self.config, *_state_files(self.config))

    def prepare_topics(self, admin: AdminClient) -> dict[str, int]:
        """`start.prepare_topics` of a handler job: its main topics must exist; its retry,
        dead-letter and control topics are created if allowed."""
        config = self.config
        kafka = config.kafka
        main = partition_counts(admin, kafka.topics, pattern=kafka.topic_pattern)
        missing = [topic for topic in kafka.topics if topic not in main]
        if missing:
            raise TopicError(
                f"kafka.topics: topic(s) {missing} do not exist on {kafka.bootstrap_servers}"
            )
        if kafka.topic_pattern is not None:
            log.info(
                "kafka.topic_pattern %r matches %d topic(s) now", kafka.topic_pattern, len(main)
            )
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
        return create_missing(admin, config, wanted, tier_configs)

    def producer_options(self, options: dict[str, str]) -> dict[str, str]:
        """The Kafka options of the job's producer, from the job's client `options`."""
        return options

    def refuse_stranded(self, position: Mapping[PartitionKey, int]) -> None:
        """Refuse to start while a retry topic taken out of retry.delays holds records
        (`retrylib.source.stranded`)."""
        refuse_stranded_retries(self.config, position)

    def table_maker(self, spark: SparkSession) -> Callable[[], None] | None:
        """What creates the job's output and dead-letter tables if missing (`make_tables`)."""
        return partial(self.make_tables, spark)

    def make_tables(self, spark: SparkSession) -> None:
        """Create the output and dead-letter tables if missing; check their columns."""
        config = self.config
        ensure_table(
            spark,
            self.output_table,
            config.handler.output_schema.to_spark(),
            what="output",
            partition_by=config.output.partition_by,
            properties=config.output.properties,
            evolve=config.output.schema_evolution,
        )
        ensure_table(spark, self.dead_letter_table, dead_letter_struct(), what="dead-letter")

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
        """`batch_commit.make_batch_commit` of a handler job: `commit` (a `BatchCommit` given
        what every job's is) with the routing task and its plan, the appends to the output and
        dead-letter tables, and the breaker, key queues, hooks and compaction, which keep their
        state in the checkpoint."""
        config = self.config
        checkpoint = Checkpoint(config.job.checkpoint)
        breaker = None  # a Spark Connect client's commit runs no batch: the server's has it
        if runs_batches and self.breaker_file is not None and config.breaker is not None:
            breaker = Breaker(
                config.breaker,
                self.breaker_file,
                on_change=partial(_publish_breaker, spark, checkpoint.breaker),
            )
        key_order = None
        if self.key_state_file is not None:
            key_order = KeyOrderStore(checkpoint.key_order, self.key_state_file)
            key_order.load(spark)
        metrics = MetricsRecorder(
            config,
            app_id,
            config.retry.tiers,
            forward=on_result,
            breaker=breaker,
            dead_letters=self.dead_letter_table,
        )
        metrics.prepare(spark)
        compactor = None
        if config.output.optimize_every_ms is not None:
            tables = [("output", self.output_table), ("dead-letter", self.dead_letter_table)]
            if config.metrics.table_ref() is not None:
                tables.append(("metrics", config.metrics.table_ref()))
            compactor = Compactor(checkpoint.compaction, config.output.optimize_every_ms, tables)
        batch_commit = commit(
            Routing(run_task, task_plan(config, partitions, signing_key), len(config.retry.tiers)),
            appends=(
                TableAppend.output(
                    self.output_table, app_id, evolve=config.output.schema_evolution
                ),
                TableAppend.dead_letter(self.dead_letter_table, app_id),
            ),
            upkeep=BatchUpkeep(
                hooks=BatchHooks(
                    config.hooks.references(BATCH_HOOKS),
                    config.handler.paths,
                    config.hooks.timeout_ms / 1000,
                ),
                on_decided=metrics.on_decided,
                on_result=(
                    metrics.on_result
                    if breaker is None
                    else partial(_feed_breaker, breaker, metrics.on_result)
                ),
                key_order=key_order,
                compactor=compactor,
            ),
        )
        if breaker is not None:
            _watch_health(batch_commit, breaker, config.handler.paths)
        return batch_commit

    def shown_tiers(self) -> tuple[RetryTier, ...]:
        """The topics `status` counts as tiers: the retry tiers."""
        return self.config.retry.tiers

    def required_topics(self) -> list[tuple[str, str, str]]:
        """(topic, label, config key) of each topic that must exist before the job starts:
        the main topics."""
        return [
            (topic, f"main topic {topic!r}", f"kafka.topics[{i}]")
            for i, topic in enumerate(self.config.kafka.topics)
        ]

    def created_topics(self) -> list[tuple[str, str]]:
        """(topic, label) of each topic the job creates when missing (if allowed), beside
        its control topic: the retry tiers' and the dead-letter topics."""
        config = self.config
        tiers = [
            (
                topic,
                f"retry topic {topic!r} (tier {tier.index + 1}, "
                f"{format_duration(tier.delay_ms)}, for {_main_label(main)})",
            )
            for tier in config.retry.tiers
            for main, topic in tier.topics.items()
        ]
        dead = [(topic, f"dead-letter topic {topic!r}") for topic in config.dead_letter.topics()]
        return [*tiers, *dead]

    def tables(self) -> list[tuple[str, TableRef, StructType]]:
        """(config key, table, columns) of each table the job writes beside its metrics."""
        return [
            ("output.table", self.output_table, self.config.handler.output_schema.to_spark()),
            ("dead_letter.table", self.dead_letter_table, dead_letter_struct()),
        ]

    def describe(self) -> list[str]:
        """What the job does, as `retrylib check` prints it."""
        return describe_handler_job(self.config)


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


def _main_label(main: str) -> str:
    return "every topic of kafka.topic_pattern" if main == ANY_TOPIC else repr(main)
