"""The driver side of one micro-batch (the `foreachBatch` body).

A batch runs in steps, each safe to repeat after a crash:

1. Unless this batch already has a manifest: executors route every record (see
   `task.routing`), and Spark writes their decisions (`results`) to the batch's staging folder
   in the checkpoint, counting them in the same Spark job (an `Observation`); the driver
   then records the batch's clock and counters in a manifest.
   The routing tasks are part of the streaming query's plan (`routed`), so that Spark
   reports their counters in its progress (`observed`); the batch's id, clock and record
   limits reach them as Spark local properties, set here before the batch's one job.
   The manifest is the commit point of the batch's decisions: a replay after it reads them
   back instead of calling the handler again.
2. The outgoing records (for retry tiers and the dead-letter topic) are produced by the
   executors, each routing task's (a produce unit) in one Kafka transaction with the unit's
   marker, so they are produced once (`produce_units`). The driver sees only a count per unit.
3. The output and dead-letter rows are appended to their Delta tables by Spark's Delta
   writer with the app transaction (`txnAppId` = the checkpoint's app id, `txnVersion` =
   batch id), so they are committed once (`delta.tables`).
4. With `retry.key_ordered`, the key queues the tasks changed are folded into the job's
   (`key_order_store`).
5. With `[output] optimize_every`, the tables are compacted when that period has passed
   (`compaction`).

Steps 2 and 3 need nothing of each other and are each idempotent, so they run at once. The
tables' state that the appends ask for (their app transactions, a Spark job per new table
version) is read during step 1, while the handler runs.

A batch's staging folder is removed once the next batch has run: Spark replays at most the
last batch, and a replay of it may still need its decisions.

The manifest is claimed, not overwritten (`state_files.claim_json`): it is created only if no
manifest exists yet, and a loser of that race (a zombie instance of the job routing the
same batch) adopts the winner's decisions. Object stores have no atomic create; there the
job relies on the Kafka producer's fencing of zombies.

A batch id below one the tables or the control topic already hold for this checkpoint's
app id means the query runs from an older copy of the checkpoint; its effects would be
skipped as "already committed", so the batch commit fails the batch with an error instead.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import replace
from functools import partial
from typing import Any

import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql import Column, DataFrame, Observation, SparkSession
from pyspark.sql.streaming import StreamingQuery

from retrylib.batch.at_once import Started, all_at_once
from retrylib.batch.driver_hooks import DriverHooks
from retrylib.batch.key_order_store import KeyOrderStore
from retrylib.batch.metrics import OBSERVED_COUNTERS
from retrylib.batch.observed import (
    OBSERVATION,
    PERCENTILES,
    decision_columns,
    lateness_metric,
    observed_columns,
    rows_metric,
)
from retrylib.batch.produce_units import produce_units
from retrylib.batch.progress_watch import ProgressWatch
from retrylib.batch.result import BatchResult
from retrylib.batch.spark_errors import (
    no_space_error,
    spark_error_reason,
    table_write_error,
    task_error,
)
from retrylib.batch.table_checks import TableState, last_appends, manifest_tables, mismatch
from retrylib.config.table_ref import TableRef
from retrylib.config.topic_names import produced_topic
from retrylib.errors import DamagedFile, RetrylibError
from retrylib.kafka import worker_clients
from retrylib.kafka.clients import RecordLimits
from retrylib.kafka.runner_lease import RunnerLease
from retrylib.retry.outcomes import Count
from retrylib.sinks.compaction import Compactor
from retrylib.sinks.markers import ControlTopic
from retrylib.sinks.produce_units import ProducePlan, ProducerSettings
from retrylib.sinks.tables import append_once, committed_version
from retrylib.spark.connect import set_job_property
from retrylib.state.checkpoint import Checkpoint
from retrylib.state.files import claim_json, read_json
from retrylib.steps import reached
from retrylib.task.forwarding import ForwardPlan
from retrylib.task.results import OUTGOING_KIND, placed, result_struct
from retrylib.task.routing import TaskPlan

log = logging.getLogger(__name__)

Plan = TaskPlan | ForwardPlan
Task = Callable[[Any, Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]
"""A `mapInArrow` body given its batch's plan: `run_task` or `run_forwarding_task`."""

_WORKER_DIED = "Python worker exited unexpectedly"
_COUNTED_KINDS = ("output", "dead_letter", OUTGOING_KIND, "key_state")
"""The kinds of result rows (`results`) a manifest counts: what the batch's effects write."""
_BATCH_PROPERTY = "spark.retrylib.batch"
"""The Spark local property that carries a batch's id, clock and record limits to its tasks
(`set_job_property`: its name starts with "spark." for Spark Connect)."""
_DECISIONS = "retrylib_decisions"
"""The name of the `Observation` of a batch's decisions (`_run_tasks`)."""


class BatchCommit:
    """Callable for `foreachBatch`: runs one batch in the steps of the module docstring."""

    def __init__(
        self,
        plan_template: Plan,
        checkpoint: Checkpoint,
        app_id: str,
        kafka_options: dict[str, str],
        bootstrap_servers: str,
        *,
        task: Task,
        record_limits: RecordLimits,
        units: int,
        signing_key: bytes,
        reader_options: Mapping[str, str],
        secret_options: tuple[str, ...] = (),
        output_table: TableRef | None = None,
        dead_letter_table: TableRef | None = None,
        evolve_output: bool = False,
        retry_tiers: int = 0,
        on_result=None,
        compactor: Compactor | None = None,
        hooks: Mapping[str, str] | None = None,
        hook_paths: tuple[str, ...] = (),
        hook_timeout_s: float = 30.0,
        key_order: KeyOrderStore | None = None,
        later_tables: tuple[TableRef, ...] = (),
        lease: RunnerLease | None = None,
    ) -> None:
        """`kafka_options`: the Kafka options of the executors' producers; `reader_options`
        those of the consumers that read the control topic;
        `units`: the routing tasks of a batch (`routed`), each a produce unit;
        `signing_key` signs the produce markers (the checkpoint's);
        `hooks`: the batch hooks (name -> "module:function", see `retrylib.task.hooks`), each
        call waited for at most `hook_timeout_s`;
        `task` routes one Spark task's records with a plan like `plan_template`: a handler
        job's `run_task`, or a delay router's `run_forwarding_task` (a delay router has no
        output or dead-letter table and no `retry_tiers`: it leaves them unset);
        `later_tables`: tables appended to once the batch is done (the metrics table), whose
        state is read along with the batch's own tables (`_read_tables`);
        `lease`: the job's runner lease, released by `close()`."""
        self.lease = lease
        self._task = task
        self._key_order = key_order
        self._later_tables = later_tables
        self._template = plan_template
        self._tiers = retry_tiers
        self._checkpoint = checkpoint
        self._output_table = output_table
        self._evolve_output = evolve_output
        self._dead_letter_table = dead_letter_table
        self._record_limits = record_limits
        self.app_id = app_id
        self._producer_settings = ProducerSettings(
            job=plan_template.job,
            app_id=app_id,
            bootstrap_servers=bootstrap_servers,
            options=dict(kafka_options),
            reader_options=dict(reader_options),
            signing_key=signing_key,
            secret_options=secret_options,
            topic_max_bytes=dict(record_limits.topic_max),
        )
        self._control = ControlTopic(
            bootstrap_servers,
            reader_options,
            produced_topic(plan_template.job),
            signing_key=signing_key,
            app_id=app_id,
            secret_options=secret_options,
        )
        self._units = units
        self._on_result = on_result
        self.failure: RetrylibError | None = None
        """The error that failed the last batch when retrylib detected it itself (a table it
        cannot write, ...): the job reports it instead of Spark's wrapping of it."""
        self._compactor = compactor
        self._hook_errors: Counter[str] = Counter()
        self._hooks = DriverHooks(hooks or {}, hook_paths, self._hook_errors, hook_timeout_s)
        self._checked_tables = False
        self._tables_made: Started | None = None
        self._tables_read: Started | None = None
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
        """The streaming query's frame: `source` routed by this commit's tasks, `units` of
        them, their result rows observed as `observed` describes."""
        # One task per executor core rather than one per Kafka range: a small batch (retries
        # trickling in over many partitions) then costs a few task start-ups, not dozens.
        # (coalesce never adds partitions, so a batch with fewer ranges is left as it is.)
        template = self._template
        results = source.coalesce(self._units).mapInArrow(
            partial(_batch_task, self._task, template), result_struct(template.output_schema)
        )
        return results.observe(OBSERVATION, *observed_columns(OBSERVED_COUNTERS, self._tiers))

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
        manifest_uri = self._checkpoint.manifest(batch_id)
        manifest = _manifest_in_flight(spark, manifest_uri, batch_id)
        replayed = manifest is not None
        if manifest is None:
            # The tables are read while the handler runs; the decisions are claimed after.
            routed, _ = all_at_once(
                spark,
                partial(self._route, df, batch_id),
                partial(self._read_tables, spark, batch_id),
            )
            manifest = claim_json(spark, manifest_uri, routed)
            replayed = manifest is not routed
            if replayed:
                log.warning("batch %d was routed concurrently; using the other run's", batch_id)
            reached("after_manifest", batch_id)
        elif not self._checked_tables:
            self._read_tables(spark, batch_id)
        result = self._apply(spark, manifest, batch_id, replayed, started)
        if self._key_order is not None:
            self._key_order.after_batch(spark, manifest, batch_id)
        reached("before_batch_end", batch_id)
        self._checkpoint.clean_up(spark, batch_id)
        reached("after_cleanup", batch_id)
        self._hooks.call("on_batch_end", batch_id, dict(result.counters))
        if self._hook_errors:
            counters = Counter(result.counters)
            counters.update(self._hook_errors)
            result = replace(result, counters=dict(counters))
        log.info("batch %s", json.dumps(_summary(result)))
        if self._on_result is not None:
            self._on_result(result)
        if self._compactor is not None:  # after every commit of the batch, metrics included
            self._compactor.after_batch(spark)
        self.last_finished = batch_id
        self.batch_finished.set()

    def read_tables_ahead(
        self, spark: SparkSession, make_tables: Callable[[], None] | None = None
    ) -> None:
        """Start, in threads, making the tables (`make_tables`: created if missing, checked
        against the config) and then reading which batch they hold, for the first batch's
        check (`_check_tables_agree`). Cold, each costs seconds of Spark jobs per table, and
        the first batch would wait for them: started before the query, the query's own start
        overlaps them. The first batch routes no record before the tables are made
        (`tables_made`), so an error there stops the job before any effect."""
        made = None if make_tables is None else Started(spark, make_tables)
        self._tables_made = made

        def read() -> list[TableState]:
            if made is not None:
                made.result()
            return self._committed_batches(spark)

        self._tables_read = Started(spark, read)

    def tables_made(self) -> None:
        """Wait until the tables given to `read_tables_ahead` are made; raise what stopped
        that. (A run whose query ends before its first batch asks it too: its tables are
        made or the run fails, as when it makes them before the query.)"""
        made, self._tables_made = self._tables_made, None
        if made is not None:
            made.result()

    def _committed_batches(self, spark: SparkSession) -> list[TableState]:
        """The output and dead-letter tables the batch appends to, each with the last batch
        it holds of this app id."""
        return [
            TableState(kind, table, committed_version(spark, table, self.app_id))
            for kind, table in self._tables().items()
            if table is not None
        ]

    def _tables(self) -> dict[str, TableRef | None]:
        """The tables the batch appends to, by the kind of result rows each takes."""
        return {"output": self._output_table, "dead_letter": self._dead_letter_table}

    def _read_tables(self, spark: SparkSession, batch_id: int) -> None:
        """Read the state of the tables the batch appends to: their app transactions, which
        every idempotent append asks for (a Spark job of a second or more per new table
        version), so that the appends find it ready. The first batch of a run also checks
        that neither they nor the control topic are ahead of the checkpoint."""
        if not self._checked_tables:
            self._check_tables_agree(spark, batch_id)
            self._checked_tables = True
        else:
            for table in (self._output_table, self._dead_letter_table):
                if table is not None:
                    committed_version(spark, table, self.app_id)
        for table in self._later_tables:
            try:
                committed_version(spark, table, self.app_id)
            except Exception as error:  # its own append reads it again, and says what failed
                log.debug("reading %s ahead of its append failed: %s", table, error)

    def _route(self, df: DataFrame, batch_id: int) -> dict[str, Any]:
        """Route the batch and stage its decisions; returns the manifest to claim."""
        plan = replace(
            self._template,
            batch_id=batch_id,
            now_ms=int(time.time() * 1000),
            max_record_bytes=self._record_limits.current(),
        )
        staging = self._checkpoint.staging(batch_id)
        decided = _run_tasks(df, plan, staging, decision_columns(_COUNTED_KINDS, self._tiers))
        reached("after_handler", batch_id)
        counters: Counter[str] = Counter()
        for text in json.loads(decided["counters"]):
            counters.update(json.loads(text))
        lateness = {
            str(tier): [decided[lateness_metric(name, tier)] for name, _ in PERCENTILES]
            for tier in range(self._tiers)
            if decided[lateness_metric("p50", tier)] is not None
        }
        rows = {kind: decided[rows_metric(kind)] for kind in _COUNTED_KINDS}
        return {
            "now_ms": plan.now_ms,
            "staging": staging,
            "units": self._units,
            # Every marker of the batch comes after this offset: its produce starts later.
            "control_from": self._control.end_offset() if rows[OUTGOING_KIND] else None,
            "rows": rows,
            "tables": manifest_tables(self._tables()),
            "counters": dict(counters),
            "lateness_ms": lateness,
        }

    def _apply(
        self,
        spark: SparkSession,
        manifest: dict[str, Any],
        batch_id: int,
        replayed: bool,
        started: float,
    ) -> BatchResult:
        rows = manifest["rows"]
        # Listing the staging folder costs a round trip to the storage: a batch with nothing
        # to produce or append (one that read only transaction markers) skips it.
        effects = rows[OUTGOING_KIND] or rows["output"] or rows["dead_letter"]
        decisions = spark.read.parquet(manifest["staging"]) if effects else None

        def of_kind(kind: str) -> DataFrame:
            return decisions.where(f"kind = '{kind}'").select(f"{kind}.*")

        def produce() -> tuple[int, int]:
            sent = self._produce(decisions, manifest, batch_id) if rows[OUTGOING_KIND] else (0, 0)
            reached("after_produce", batch_id)
            return sent

        def append_output() -> bool:
            committed = bool(rows["output"]) and self._append(
                of_kind("output"),
                "output.table",
                self._output_table,
                batch_id,
                self._evolve_output,
            )
            reached("after_output_commit", batch_id)
            return committed

        def append_dead_letters() -> bool:
            committed = bool(rows["dead_letter"]) and self._append(
                of_kind("dead_letter"), "dead_letter.table", self._dead_letter_table, batch_id
            )
            reached("after_dead_letter_commit", batch_id)
            return committed

        # The three effects are each idempotent and need nothing of each other, so they run
        # at once: a batch then waits for the slowest (a Delta append, whose idempotent-write
        # check rebuilds the table's state) instead of for their sum.
        (produced, opened), output_committed, dead_committed = all_at_once(
            spark, produce, append_output, append_dead_letters
        )
        counters = Counter(manifest["counters"])
        if opened:
            counters[Count.KAFKA_CLIENTS_OPENED] += opened
        return BatchResult(
            batch_id,
            replayed,
            dict(counters),
            produced,
            output_committed,
            dead_committed,
            round((time.monotonic() - started) * 1000),
            {int(tier): values for tier, values in manifest.get("lateness_ms", {}).items()},
        )

    def _produce(
        self, decisions: DataFrame, manifest: dict[str, Any], batch_id: int
    ) -> tuple[int, int]:
        """Produce the batch's outgoing records (among its `decisions`) from the executors;
        returns their count and the Kafka clients the produce tasks opened."""
        if "units" not in manifest:
            raise RetrylibError(
                f"batch {batch_id} was routed by an earlier version of retrylib, which "
                "produced it from the driver: run that version until the batch is done, stop "
                "it gracefully (SIGTERM), then start this one"
            )
        plan = ProducePlan(
            self._producer_settings,
            batch_id=batch_id,
            units=manifest["units"],
            control_from=manifest["control_from"],
        )
        try:
            return produce_units(decisions, plan)
        except Exception as e:  # a task's error, as Spark wraps it
            raised = task_error(e)
            if raised is None:
                raise
            raise raised from e

    def _append(
        self, frame: DataFrame, key: str, table: TableRef, batch_id: int, evolve: bool = False
    ) -> bool:
        """`append_once` of `frame` to the table of config key `key`.

        Raises `TableWriteError` naming the table, its location and what to check when Spark
        cannot write it. The batch is not done then: Spark runs it again after a restart,
        from its manifest, and Delta's transaction keeps each append to one.
        """
        try:
            return append_once(frame, table, app_id=self.app_id, batch_id=batch_id, evolve=evolve)
        except Exception as e:  # Spark's and the storage's errors: many classes, all fatal here
            raise table_write_error(batch_id, key, table, spark_error_reason(e)) from e

    def _check_tables_agree(self, spark: SparkSession, batch_id: int) -> None:
        """Raise `RetrylibError` when the control topic already holds a later batch of this
        checkpoint, or a table does, or a table lacks an earlier batch that appended to it
        (`table_checks`).

        Spark replays at most the last unfinished batch, so a produce marker is never above
        the batch that runs first after a start, unless the checkpoint is not the one the
        topics were written with.
        """
        produced = self._control.last_produced_batch()
        if produced is not None and produced > batch_id:
            raise RetrylibError(
                f"control topic {self._control.topic} holds the marker of batch {produced} of "
                f"{self.app_id}, but the query is running batch {batch_id}: the checkpoint is "
                "older than what it already produced. Restore the checkpoint, or start from a "
                "new one"
            )
        read_ahead, self._tables_read = self._tables_read, None
        states = self._committed_batches(spark) if read_ahead is None else read_ahead.result()
        appended = last_appends(
            self._earlier_manifests(spark, batch_id), {s.kind: s.table for s in states}
        )
        for state in states:
            error = mismatch(state, self.app_id, batch_id, appended.get(state.kind))
            if error is not None:
                raise RetrylibError(error)

    def _earlier_manifests(
        self, spark: SparkSession, batch_id: int
    ) -> Iterator[tuple[int, dict[str, Any]]]:
        """The readable manifests the checkpoint keeps of batches before `batch_id`, newest
        first, each read when asked for; an unreadable one of a finished batch is logged and
        left out."""
        for earlier in sorted(self._checkpoint.manifest_ids(spark), reverse=True):
            if earlier >= batch_id:
                continue
            uri = self._checkpoint.manifest(earlier)
            try:
                manifest = read_json(spark, uri)
            except DamagedFile as error:
                log.warning(
                    "the manifest of finished batch %d, %s, is damaged (%s): left out of the "
                    "tables' check",
                    earlier,
                    uri,
                    error.reason,
                )
                continue
            if isinstance(manifest, dict):
                yield earlier, manifest

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


def _run_tasks(
    df: DataFrame, plan: Plan, staging: str, decisions: list[Column], *, isolate: bool = False
) -> dict[str, Any]:
    """Route the batch on the executors and write their result rows to `staging` (Parquet);
    returns the values of the aggregate columns `decisions` over those rows.

    `df` is the query's frame (`BatchCommit.routed`): writing it runs the routing tasks,
    given `plan`'s batch id, clock and record limits. The aggregates are observed in the
    same Spark job as the write (`Observation`), so counting the decisions reads nothing
    back; but for a Spark Connect 4.0 server, which at times sends a write's observed
    metrics not at all (`Observation.get` is then empty): there they are computed from the
    staged rows.

    If a Python worker dies (a handler called os._exit or crashed in native code), the
    batch runs again with every handler call in a process of its own, so that the record
    responsible fails alone, as a `HandlerCrashed` attempt, instead of failing every
    replay of the batch.
    """
    spark = df.sparkSession
    set_job_property(spark, _BATCH_PROPERTY, _batch_property(plan, isolate))
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
        set_job_property(spark, _BATCH_PROPERTY, None)
    log.warning(
        "batch %d: a Python worker died while handling records; running the batch again "
        "with each handler call in its own process",
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
    """The `mapInArrow` body of `BatchCommit.routed`: `task` with `template` completed by
    the batch's values, which `_run_tasks` sets as a local property of the batch's job."""
    values = TaskContext.get().getLocalProperty(_BATCH_PROPERTY)
    if values is None:
        raise RetrylibError(
            "the routing tasks ran outside a batch of the job: the query's frame must only be "
            "written by BatchCommit"
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


def _summary(result: BatchResult) -> dict[str, Any]:
    return {
        "batch_id": result.batch_id,
        "replayed": result.replayed,
        "duration_ms": result.duration_ms,
        "produced": result.produced,
        **result.counters,
    }
