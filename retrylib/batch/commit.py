"""The driver side of one micro-batch (the `foreachBatch` body): the routing stage, then the
effects the caller supplied.

A batch runs in steps, each safe to repeat after a crash:

1. The routing stage (`routing_stage`): unless this batch already has a manifest, executors
   route every record (see `task.routing`), Spark writes their decisions to the batch's
   staging folder in the checkpoint, and the driver claims the batch's manifest, the commit
   point of its decisions.
2. The effects (`effects`), made at once, each once: the outgoing records (for retry tiers
   and the dead-letter topic, or a delay router's destinations) produced by the executors,
   each routing task's (a produce unit) in one Kafka transaction with the unit's marker
   (`produce_units`); for a handler job, the output and dead-letter rows appended to their
   Delta tables with the app transaction (`table_appends`). At a run's first batch the
   tables and the control topic are checked against the checkpoint during step 1, while the
   handler runs (`effect_targets`).
3. With `retry.key_ordered`, the key queues the tasks changed are folded into the job's
   (`key_order_store`).
4. With `[output] optimize_every`, the tables are compacted when that period has passed
   (`compaction`).

A batch's staging folder is removed once the next batch has run: Spark replays at most the
last batch, and a replay of it may still need its decisions.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming import StreamingQuery

from retrylib.batch.driver_hooks import DriverHooks
from retrylib.batch.effect_targets import EffectTargets
from retrylib.batch.effects import Made, make_effects
from retrylib.batch.key_order_store import KeyOrderStore
from retrylib.batch.produce_units import KafkaProduce
from retrylib.batch.progress_watch import ProgressWatch
from retrylib.batch.result import BatchResult
from retrylib.batch.routing_stage import Routing, RoutingStage, Staging
from retrylib.batch.spark_errors import no_space_error
from retrylib.batch.table_appends import TableAppend
from retrylib.config.table_ref import TableRef
from retrylib.errors import RetrylibError
from retrylib.kafka import worker_clients
from retrylib.kafka.runner_lease import RunnerLease
from retrylib.retry.outcomes import Count
from retrylib.sinks.compaction import Compactor
from retrylib.steps import reached
from retrylib.task.results import OUTGOING_KIND

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BatchHooks:
    """The batch hooks (hook name -> "module:function", see `retrylib.task.hooks`), imported
    with `paths` on sys.path, each call waited for at most `timeout_s`."""

    references: Mapping[str, str] = field(default_factory=dict)
    paths: tuple[str, ...] = ()
    timeout_s: float = 30.0


@dataclass(frozen=True)
class BatchUpkeep:
    """What a job does around each batch besides routing it and making its effects: `hooks`
    called at its start and end, `on_decided` given its manifest once its decisions are fixed
    (before its effects are made), `on_result` told what it did, a handler job's key queues
    folded in (`key_order`, `retry.key_ordered`) and tables compacted (`compactor`,
    `output.optimize_every`)."""

    hooks: BatchHooks = BatchHooks()
    on_decided: Callable[[Mapping[str, Any]], None] | None = None
    on_result: Callable[[BatchResult], None] | None = None
    key_order: KeyOrderStore | None = None
    compactor: Compactor | None = None


class BatchCommit:
    """Callable for `foreachBatch`: runs one batch in the steps of the module docstring."""

    def __init__(
        self,
        routing: Routing,
        staging: Staging,
        produce: KafkaProduce,
        *,
        appends: tuple[TableAppend, ...] = (),
        later_tables: tuple[TableRef, ...] = (),
        upkeep: BatchUpkeep = BatchUpkeep(),
        lease: RunnerLease | None = None,
    ) -> None:
        """The routing stage of `routing` as `staging` says; the effects: `produce`, then
        `appends` (a delay router has none); `later_tables`: tables appended to once the
        batch is done (the metrics table), prepared for it with the appends' tables;
        `lease`: the job's runner lease, released by `close()`."""
        self.lease = lease
        self.app_id = produce.settings.app_id
        self._stage = RoutingStage(routing, staging)
        self._effects = (produce, *appends)
        self._targets = EffectTargets(
            produce.control_topic(),
            {append.kind: append.table for append in appends},
            later_tables,
            staging.checkpoint,
            self.app_id,
        )
        self._checkpoint = staging.checkpoint
        self._upkeep = upkeep
        self.failure: RetrylibError | None = None
        """The error that failed the last batch when retrylib detected it itself (a table it
        cannot write, ...): the job reports it instead of Spark's wrapping of it."""
        self._hook_errors: Counter[str] = Counter()
        hooks = upkeep.hooks
        self._hooks = DriverHooks(hooks.references, hooks.paths, self._hook_errors, hooks.timeout_s)
        self.batch_finished = threading.Event()
        """Set whenever a batch has done all its work (a graceful stop waits for it)."""
        self.last_finished: int | None = None
        """The id of the last batch that did all its work in this run."""
        self._watch: ProgressWatch | None = None
        self._closers: list[Callable[[], None]] = []

    def on_close(self, closer: Callable[[], None]) -> None:
        """Have `close()` call `closer` (a watch the job started beside the batches)."""
        self._closers.append(closer)

    def routed(self, source: DataFrame) -> DataFrame:
        """The streaming query's frame: `source` routed by this commit's tasks
        (`RoutingStage.routed`)."""
        return self._stage.routed(source)

    def read_tables_ahead(
        self, spark: SparkSession, make_tables: Callable[[], None] | None = None
    ) -> None:
        """Start making the tables (`make_tables`) and reading which batch they hold, in
        threads, for the first batch (`EffectTargets.read_ahead`)."""
        self._targets.read_ahead(spark, make_tables)

    def tables_made(self) -> None:
        """Wait until the tables given to `read_tables_ahead` are made; raise what stopped
        that. (A run whose query ends before its first batch asks it too: its tables are
        made or the run fails, as when it makes them before the query.)"""
        self._targets.made()

    def __call__(self, df: DataFrame, batch_id: int) -> None:
        try:
            self._run(df, batch_id)
        except RetrylibError as e:
            self.failure = e
            raise
        except Exception as e:
            full = no_space_error(e)
            if full is None:
                raise
            self.failure = full
            raise full from e

    def _run(self, df: DataFrame, batch_id: int) -> None:
        started = time.monotonic()
        self.tables_made()
        self._hook_errors.clear()
        self._hooks.call("on_batch_start", batch_id)
        spark = df.sparkSession
        manifest, replayed = self._stage.run(df, batch_id, self._targets)
        upkeep = self._upkeep
        if upkeep.on_decided is not None:
            upkeep.on_decided(manifest)
        made = make_effects(spark, self._effects, manifest, batch_id, self._stage.staged_schema)
        result = _result(manifest, made, batch_id, replayed, started)
        if upkeep.key_order is not None:
            upkeep.key_order.after_batch(spark, manifest, batch_id)
        reached("before_batch_end", batch_id)
        self._checkpoint.clean_up(spark, batch_id)
        reached("after_cleanup", batch_id)
        self._hooks.call("on_batch_end", batch_id, dict(result.counters))
        if self._hook_errors:
            counters = Counter(result.counters)
            counters.update(self._hook_errors)
            result = replace(result, counters=dict(counters))
        log.info("batch %s", json.dumps(_summary(result)))
        if upkeep.on_result is not None:
            upkeep.on_result(result)
        if upkeep.compactor is not None:  # after every commit of the batch, metrics included
            upkeep.compactor.after_batch(spark)
        self.last_finished = batch_id
        self.batch_finished.set()

    def follow(self, query: StreamingQuery) -> None:
        """Learn from `query`'s progress which batch a Spark Connect server's copy of this
        commit (`BatchFunction`) finished, for `batch_finished` and `last_finished`."""
        self._watch = ProgressWatch(query, self._finished_elsewhere)

    def _finished_elsewhere(self, batch_id: int) -> None:
        self.last_finished = batch_id
        self.batch_finished.set()

    def close(self) -> None:
        """Let go of the Kafka clients this process keeps (the control topic's reader) and
        of the runner lease; log the batches a Spark Connect server finished last."""
        if self._watch is not None:
            self._watch.stop()
        for closer in self._closers:
            closer()
        worker_clients.close_all()
        if self.lease is not None:
            self.lease.release()


class BatchFunction:
    """The `foreachBatch` function of a Spark Connect client's query.

    The server pickles it and calls it in a Python process of its own for the life of the
    query. It builds the job's `BatchCommit` there, on the first batch, with `build` (given
    that process's session), so the commit's Kafka clients, threads and hooks belong to the
    process that runs the batches.
    """

    def __init__(self, build: Callable[[SparkSession], BatchCommit]) -> None:
        self._build = build
        self._commit: BatchCommit | None = None

    def __call__(self, df: DataFrame, batch_id: int) -> None:
        if self._commit is None:
            self._commit = self._build(df.sparkSession)
        self._commit(df, batch_id)


def _result(
    manifest: Mapping[str, Any],
    made: Mapping[str, Made],
    batch_id: int,
    replayed: bool,
    started: float,
) -> BatchResult:
    """What batch `batch_id` did: its `manifest`'s counters and what its effects `made`."""
    nothing = Made()
    produced = made.get(OUTGOING_KIND, nothing)
    counters = Counter(manifest["counters"])
    if produced.clients_opened:
        counters[Count.KAFKA_CLIENTS_OPENED] += produced.clients_opened
    return BatchResult(
        batch_id,
        replayed,
        dict(counters),
        produced.produced,
        made.get("output", nothing).committed,
        made.get("dead_letter", nothing).committed,
        round((time.monotonic() - started) * 1000),
        {int(tier): values for tier, values in manifest.get("lateness_ms", {}).items()},
    )


def _summary(result: BatchResult) -> dict[str, Any]:
    return {
        "batch_id": result.batch_id,
        "replayed": result.replayed,
        "duration_ms": result.duration_ms,
        "produced": result.produced,
        **result.counters,
    }
