"""A batch's routing stage: its records routed on the executors, their decisions staged in the
checkpoint, and the batch's manifest claimed.

The routing tasks are part of the streaming query's plan (`routed`), so that Spark reports
their counters in its progress (`observed`); the batch's id, clock and record limits reach
them as Spark local properties, set here before the batch's one job. Spark writes their
decisions (`results`) to the batch's staging folder in the checkpoint, counting them in the
same Spark job (an `Observation`); the driver then records the batch's clock and counters in
a manifest, with what its effects' targets note (`EffectTargets.noted`).

The manifest is the commit point of the batch's decisions: a replay after it reads them back
instead of calling the handler again. It is claimed, not overwritten
(`state_files.claim_json`): it is created only if no manifest exists yet, and a loser of that
race (a zombie instance of the job routing the same batch) adopts the winner's decisions.
Object stores have no atomic create; there the job relies on the Kafka producer's fencing of
zombies.
"""

from __future__ import annotations

import json
import logging
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql import Column, DataFrame, Observation, SparkSession

from retrylib.batch.at_once import all_at_once
from retrylib.batch.effect_targets import EffectTargets
from retrylib.batch.metrics import OBSERVED_COUNTERS
from retrylib.batch.observed import (
    OBSERVATION,
    PERCENTILES,
    decision_columns,
    lateness_metric,
    observed_columns,
    rows_metric,
)
from retrylib.errors import DamagedFile, RetrylibError
from retrylib.kafka.clients import RecordLimits
from retrylib.spark.flavour import flavour_of
from retrylib.state.checkpoint import Checkpoint
from retrylib.state.files import claim_json, read_json
from retrylib.steps import reached
from retrylib.task.forwarding import ForwardPlan
from retrylib.task.plan import TaskPlan
from retrylib.task.results import NOT_BEFORE_MS, OUTGOING_KIND, placed, result_struct

log = logging.getLogger(__name__)

Plan = TaskPlan | ForwardPlan
Task = Callable[[Any, Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]
"""A `mapInArrow` body given its batch's plan: `run_task` or `run_forwarding_task`."""

_WORKER_DIED = "Python worker exited unexpectedly"
_COUNTED_KINDS = ("output", "dead_letter", OUTGOING_KIND, "key_state")
"""The kinds of result rows (`results`) a manifest counts: what the batch's effects write."""
_BATCH_PROPERTY = "spark.retrylib.batch"
"""The Spark local property that carries a batch's id, clock and record limits to its tasks
(`Flavour.set_job_property`: its name starts with "spark." for Spark Connect)."""
_DECISIONS = "retrylib_decisions"
"""The name of the `Observation` of a batch's decisions (`_run_tasks`)."""


@dataclass(frozen=True)
class Routing:
    """How a job's records are routed: `task` routes one Spark task's records with a plan
    like `plan` (a handler job's `run_task` with its `TaskPlan`, a delay router's
    `run_forwarding_task` with its `ForwardPlan`); `retry_tiers`: the tiers whose lateness
    is observed (a delay router has none)."""

    task: Task
    plan: Plan
    retry_tiers: int = 0


@dataclass(frozen=True)
class Staging:
    """The job's part of every batch's routing stage: the `checkpoint` its decisions are
    staged and its manifests claimed in, the `record_limits` its tasks keep to, and `units`,
    the routing tasks of a batch (one per executor core), each a produce unit."""

    checkpoint: Checkpoint
    record_limits: RecordLimits
    units: int


class RoutingStage:
    """The routing stage of a job's batches: `routing` in the frame of the query
    (`routed`), run and claimed for each batch (`run`) as `staging` says."""

    def __init__(self, routing: Routing, staging: Staging) -> None:
        self._routing = routing
        self._staging = staging
        self.staged_schema = result_struct(routing.plan.output_schema)
        """The schema of the result rows a batch stages (`_run_tasks`)."""

    def routed(self, source: DataFrame) -> DataFrame:
        """The streaming query's frame: `source` routed by the routing tasks, `units` of
        them, their result rows observed as `observed` describes."""
        # One task per executor core rather than one per Kafka range: a small batch (retries
        # trickling in over many partitions) then costs a few task start-ups, not dozens.
        # (coalesce never adds partitions, so a batch with fewer ranges is left as it is.)
        routing = self._routing
        results = source.coalesce(self._staging.units).mapInArrow(
            partial(_batch_task, routing.task, routing.plan), self.staged_schema
        )
        return results.observe(
            OBSERVATION, *observed_columns(OBSERVED_COUNTERS, routing.retry_tiers)
        )

    def run(
        self, df: DataFrame, batch_id: int, targets: EffectTargets
    ) -> tuple[dict[str, Any], bool]:
        """Batch `batch_id`'s manifest, and whether its decisions came from an earlier run.

        Unless the batch has a manifest already, route `df` (the query's frame of the
        batch) and stage its decisions while `targets` are checked (at a run's first
        batch), then claim the manifest: this run's, or the one a concurrent run claimed
        first. A batch replayed from its manifest has `targets` checked when it is the first
        of a run.
        """
        spark = df.sparkSession
        targets.prepare_appends(spark)
        manifest_uri = self._staging.checkpoint.manifest(batch_id)
        manifest = _manifest_in_flight(spark, manifest_uri, batch_id)
        if manifest is not None:
            targets.check_once(spark, batch_id)
            return manifest, True
        # The targets are checked while the handler runs; the decisions are claimed after.
        routed, _ = all_at_once(
            spark,
            partial(self._route, df, batch_id, targets),
            partial(targets.check_once, spark, batch_id),
        )
        manifest = claim_json(spark, manifest_uri, routed)
        replayed = manifest is not routed
        if replayed:
            log.warning("batch %d was routed concurrently; using the other run's", batch_id)
        reached("after_manifest", batch_id)
        return manifest, replayed

    def _route(self, df: DataFrame, batch_id: int, targets: EffectTargets) -> dict[str, Any]:
        """Route the batch and stage its decisions; returns the manifest to claim."""
        routing, staging = self._routing, self._staging
        plan = replace(
            routing.plan,
            batch_id=batch_id,
            now_ms=int(time.time() * 1000),
            max_record_bytes=staging.record_limits.current(),
        )
        where = staging.checkpoint.staging(batch_id)
        tiers = routing.retry_tiers
        decided = _run_tasks(df, plan, where, decision_columns(_COUNTED_KINDS, tiers))
        reached("after_handler", batch_id)
        counters, not_before_ms = task_counters(json.loads(decided["counters"]))
        lateness = {
            str(tier): [decided[lateness_metric(name, tier)] for name, _ in PERCENTILES]
            for tier in range(tiers)
            if decided[lateness_metric("p50", tier)] is not None
        }
        rows = {kind: decided[rows_metric(kind)] for kind in _COUNTED_KINDS}
        return {
            "now_ms": plan.now_ms,
            "staging": where,
            "units": staging.units,
            "rows": rows,
            **targets.noted(rows),
            "counters": dict(counters),
            "lateness_ms": lateness,
            "not_before_ms": not_before_ms,
        }


def task_counters(texts: list[str]) -> tuple[Counter[str], int]:
    """The batch's counters, summed over its tasks' counters objects (JSON `texts`), and the
    latest time before which its outgoing records may not be produced (0 for none)."""
    counters: Counter[str] = Counter()
    not_before_ms = 0
    for text in texts:
        task = json.loads(text)
        not_before_ms = max(not_before_ms, task.pop(NOT_BEFORE_MS, 0))
        counters.update(task)
    return counters, not_before_ms


def _run_tasks(
    df: DataFrame, plan: Plan, staging: str, decisions: list[Column], *, isolate: bool = False
) -> dict[str, Any]:
    """Route the batch on the executors and write their result rows to `staging` (Parquet);
    returns the values of the aggregate columns `decisions` over those rows.

    `df` is the query's frame (`RoutingStage.routed`): writing it runs the routing tasks,
    given `plan`'s batch id, clock and record limits. The aggregates are observed in the
    same Spark job as the write (`Observation`), so counting the decisions reads nothing
    back; but for a Spark Connect 4.0 server, which at times sends a write's observed
    metrics not at all (`Observation.get` is then empty): there they are computed from the
    staged rows.

    If a Python worker dies (a handler called os._exit or crashed in native code, or the
    worker's watchdog ended it for a call that would not stop, `task.watchdog`), the batch
    runs again with every handler call in a process of its own, so that the record
    responsible fails alone, as a `HandlerCrashed` attempt, instead of failing every
    replay of the batch.
    """
    spark = df.sparkSession
    flavour_of(spark).set_job_property(spark, _BATCH_PROPERTY, _batch_property(plan, isolate))
    observed = Observation(_DECISIONS)  # one per write: an Observation is filled once
    try:
        df.observe(observed, *decisions).write.mode("overwrite").parquet(staging)
        values = observed.get
        if not values:
            log.warning(
                "batch %d: Spark sent no observed metrics of its routing tasks; counting "
                "their staged rows instead",
                plan.batch_id,
            )
            values = spark.read.parquet(staging).agg(*decisions).first().asDict()
        return values
    except Exception as error:
        if isolate or plan.isolated() is None or _WORKER_DIED not in str(error):
            raise
    finally:
        flavour_of(spark).set_job_property(spark, _BATCH_PROPERTY, None)
    log.warning(
        "batch %d: a Python worker died while handling records (a call of yours ended it, or "
        "its watchdog did, for a call past handler.timeout that did not stop: the executor's "
        "log says which); running the batch again with each handler call in its own process",
        plan.batch_id,
    )
    return _run_tasks(df, plan, staging, decisions, isolate=True)


def _manifest_in_flight(spark: SparkSession, uri: str, batch_id: int) -> dict[str, Any] | None:
    """The manifest of batch `batch_id` at `uri`, about to run, or None when it has none yet.

    Raises `RetrylibError` naming the file when it is damaged: the batch's effects may have
    been made from it in part, so routing the batch again could differ from them."""
    try:
        return read_json(spark, uri)
    except DamagedFile as error:
        raise RetrylibError(
            f"the manifest of batch {batch_id}, {uri}, is damaged ({error.reason}): it holds "
            "the decisions the batch's effects are made from, and some may be made already, "
            "so the batch is not routed again. Restore the file from a backup, or start the "
            "job from a new checkpoint (job.checkpoint)"
        ) from error


def _batch_property(plan: Plan, isolate: bool) -> str:
    return json.dumps(
        {
            "batch_id": plan.batch_id,
            "now_ms": plan.now_ms,
            "max_record_bytes": dict(plan.max_record_bytes),
            "isolate": isolate,
        }
    )


def _batch_task(
    task: Task, template: Plan, batches: Iterator[pa.RecordBatch]
) -> Iterator[pa.RecordBatch]:
    """The `mapInArrow` body of `RoutingStage.routed`: `task` with `template` completed by
    the batch's values, which `_run_tasks` sets as a local property of the batch's job."""
    values = TaskContext.get().getLocalProperty(_BATCH_PROPERTY)
    if values is None:
        raise RetrylibError(
            "the routing tasks ran outside a batch of the job: the query's frame must only be "
            "written by its batch commit"
        )
    batch = json.loads(values)
    plan = replace(
        template,
        batch_id=batch["batch_id"],
        now_ms=batch["now_ms"],
        max_record_bytes=batch["max_record_bytes"],
    )
    isolated = plan.isolated() if batch["isolate"] else None
    unit, seq = TaskContext.get().partitionId(), 0
    for rows in task(isolated or plan, batches):
        yield placed(rows, unit, seq)
        seq += rows.num_rows
