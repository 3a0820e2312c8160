"""The driver side of one micro-batch (the `foreachBatch` body).

A batch runs in steps, each safe to repeat after a crash:

1. Unless this batch already has a manifest: executors route every record (see
   `batch_task`) and write files; the driver records the files and the batch's clock in a
   manifest. The manifest is the commit point of the batch's decisions: a replay after it
   reuses them instead of calling the handler again.
2. Staged retry and dead-letter records are produced in one Kafka transaction with a
   per-batch marker, so they are produced once (`staging`).
3. The output and dead-letter files are committed to their Delta tables with the app
   transaction (the checkpoint's app id, batch id), so they are committed once (`delta_sink`).

The manifest is claimed, not overwritten: on a local filesystem it is linked into place
only if no manifest exists yet, and a loser of that race (a zombie instance of the job
routing the same batch) adopts the winner's decisions. Object stores have no such create
here; there the job relies on the Kafka producer's fencing of zombies.

A batch id below one the tables or the control topic already hold for this checkpoint's
app id means the query runs from an older copy of the checkpoint; its effects would be
skipped as "already committed", so the router fails the batch with an error instead.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

import pyarrow.fs as pafs
from pyspark.sql import DataFrame, Row

from retrylib.batch_task import SUMMARY_DDL, TaskPlan, run_task
from retrylib.dead_letter import DEAD_LETTER_SCHEMA
from retrylib.delta_sink import DataFile, commit_files, committed_batch
from retrylib.errors import RetrylibError
from retrylib.faults import crash_point
from retrylib.staging import StagedProducer
from retrylib.storage import delete_tree, filesystem, join, list_names, read_json, write_json

log = logging.getLogger(__name__)

_WORKER_DIED = "Python worker exited unexpectedly"
_MANIFESTS_KEPT = 20


@dataclass(frozen=True)
class BatchResult:
    """What one batch did; `replayed` is true when its decisions came from a manifest."""

    batch_id: int
    replayed: bool
    counters: dict[str, int]
    produced: int
    output_committed: bool
    dead_letters_committed: bool
    duration_ms: int


class BatchRouter:
    """Callable for `foreachBatch`; `plan_for(batch_id, now_ms)` gives the task plan."""

    def __init__(
        self,
        plan_template: TaskPlan,
        state_dir: str,
        kafka_options: dict[str, str],
        bootstrap_servers: str,
        on_result=None,
    ) -> None:
        self._template = plan_template
        self._state_dir = state_dir
        self.app_id = checkpoint_identity(state_dir, plan_template.job)
        self._producer = StagedProducer(
            plan_template.job,
            self.app_id,
            bootstrap_servers,
            kafka_options,
            state_dir=state_dir,
        )
        self._on_result = on_result
        self._checked_tables = False
        self.batch_finished = threading.Event()
        """Set whenever a batch has done all its work (a graceful stop waits for it)."""

    def __call__(self, df: DataFrame, batch_id: int) -> None:
        started = time.monotonic()
        if not self._checked_tables:
            self._check_tables_not_ahead(batch_id)
            self._checked_tables = True
        manifest_uri = join(self._state_dir, "manifests", f"{batch_id}.json")
        manifest = read_json(manifest_uri)
        replayed = manifest is not None
        if manifest is None:
            routed = self._route(df, batch_id)
            manifest = claim_json(manifest_uri, routed)
            replayed = manifest is not routed
            if replayed:
                log.warning("batch %d was routed concurrently; using the other run's", batch_id)
            crash_point("after_manifest", batch_id)
        result = self._apply(manifest, batch_id, replayed, started)
        crash_point("before_batch_end", batch_id)
        self._clean_up(batch_id)
        crash_point("after_cleanup", batch_id)
        log.info("batch %s", json.dumps(_summary(result)))
        if self._on_result is not None:
            self._on_result(result)
        self.batch_finished.set()

    def _route(self, df: DataFrame, batch_id: int) -> dict[str, Any]:
        plan = _with_batch(
            self._template, batch_id, int(time.time() * 1000), self._staging_dir(batch_id)
        )
        summary = _run_tasks(df, plan)
        crash_point("after_handler", batch_id)
        files: dict[str, list[str]] = {"output": [], "dead_letter": [], "staged": []}
        counters: Counter[str] = Counter()
        for row in summary:
            if row.kind == "counters":
                counters.update(json.loads(row.payload))
            else:
                files[row.kind].append(row.payload)
        return {"now_ms": plan.now_ms, "files": files, "counters": dict(counters)}

    def _apply(
        self, manifest: dict[str, Any], batch_id: int, replayed: bool, started: float
    ) -> BatchResult:
        files = {
            kind: [DataFile.from_json(text) for text in texts]
            for kind, texts in manifest["files"].items()
        }
        staged_paths = [join(f.table, f.path) for f in files["staged"]]
        produced = self._producer.produce_once(batch_id, staged_paths) if staged_paths else 0
        crash_point("after_produce", batch_id)
        output_committed = bool(files["output"]) and commit_files(
            self._template.output_table,
            self._template.output_schema,
            files["output"],
            app_id=self.app_id,
            batch_id=batch_id,
        )
        crash_point("after_output_commit", batch_id)
        dead_committed = bool(files["dead_letter"]) and commit_files(
            self._template.dead_letter_table,
            DEAD_LETTER_SCHEMA,
            files["dead_letter"],
            app_id=self.app_id,
            batch_id=batch_id,
        )
        crash_point("after_dead_letter_commit", batch_id)
        return BatchResult(
            batch_id,
            replayed,
            manifest["counters"],
            produced,
            output_committed,
            dead_committed,
            round((time.monotonic() - started) * 1000),
        )

    def _check_tables_not_ahead(self, batch_id: int) -> None:
        """Raise `RetrylibError` when a table already holds a later batch of this checkpoint.

        Spark replays at most the last unfinished batch, so a table's app transaction is
        never above the batch that runs first after a start, unless the checkpoint is not
        the one the tables were written with.
        """
        for what, uri in (
            ("output", self._template.output_table),
            ("dead-letter", self._template.dead_letter_table),
        ):
            done = committed_batch(uri, self.app_id)
            if done is not None and done > batch_id:
                raise RetrylibError(
                    f"the {what} table {uri} holds batch {done} of {self.app_id!r}, but the "
                    f"query is at batch {batch_id}: the checkpoint is older than the tables. "
                    "Its batches would be skipped as already committed. Restore the latest "
                    "checkpoint, or start from a new one"
                )

    def _staging_dir(self, batch_id: int) -> str:
        return join(self._state_dir, "staged", str(batch_id))

    def _clean_up(self, batch_id: int) -> None:
        """Drop staged files of finished batches and manifests older than the last few."""
        for name in list_names(join(self._state_dir, "staged")):
            if name.isdigit() and int(name) <= batch_id:
                delete_tree(join(self._state_dir, "staged", name))
        for name in list_names(join(self._state_dir, "manifests")):
            number, _, rest = name.partition(".json")
            if not number.isdigit():
                continue
            leftover = rest.startswith(".tmp") and int(number) <= batch_id  # a crashed write
            if leftover or int(number) < batch_id - _MANIFESTS_KEPT:
                delete_tree(join(self._state_dir, "manifests", name))

    def close(self) -> None:
        self._producer.close()


def checkpoint_identity(state_dir: str, job_name: str) -> str:
    """The Delta app id and produce-marker id of this checkpoint: "<job>-<random>".

    Created with the checkpoint and kept in it. Batch ids restart at 0 when a checkpoint is
    deleted; a fresh id keeps the new run's batches from being mistaken for replays of the
    old run's (which would skip their commits and lose their records).
    """
    uri = join(state_dir, "identity.json")
    identity = read_json(uri)
    if identity is None:  # two instances starting at once agree on the first one's id
        identity = claim_json(uri, {"app_id": f"{job_name}-{uuid.uuid4().hex[:12]}"})
    return identity["app_id"]


def claim_json(uri: str, content: dict[str, Any]) -> dict[str, Any]:
    """Write `content` at `uri` unless a file is there already; return what is in place.

    The caller compares the result with `content` by identity to learn whether it won. On a
    local filesystem the file is written and synced beside, then hard-linked into place,
    which fails when the name exists: the first writer wins, readers never see a partial
    file, and the decision survives a machine crash. Elsewhere it is a plain atomic PUT.
    """
    fs, path = filesystem(uri)
    if not isinstance(fs, pafs.LocalFileSystem):
        write_json(uri, content)
        return content
    os.makedirs(os.path.dirname(path), exist_ok=True)
    temporary = f"{path}.tmp-{os.getpid()}"
    with open(temporary, "wb") as out:
        out.write(json.dumps(content).encode())
        out.flush()
        os.fsync(out.fileno())
    try:
        os.link(temporary, path)
    except FileExistsError:
        existing = read_json(uri)
        if existing is None:  # pragma: no cover - removed between link and read
            raise
        return existing
    finally:
        os.unlink(temporary)
    directory = os.open(os.path.dirname(path), os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)
    return content


def _run_tasks(df: DataFrame, plan: TaskPlan) -> list[Row]:
    """Route the batch on the executors; returns the tasks' summary rows.

    If a Python worker dies (a handler called os._exit or crashed in native code), the
    batch runs again with every handler call in a process of its own, so that the record
    responsible fails alone, as a `HandlerCrashed` attempt, instead of failing every
    replay of the batch.
    """
    # One task per executor core rather than one per Kafka range: a small batch (retries
    # trickling in over many partitions) then costs a few task start-ups, not dozens.
    # (coalesce never adds partitions, so a batch with fewer ranges is left as it is.)
    slots = max(1, df.sparkSession.sparkContext.defaultParallelism)
    try:
        return df.coalesce(slots).mapInArrow(partial(run_task, plan), SUMMARY_DDL).collect()
    except Exception as error:
        if plan.isolate or _WORKER_DIED not in str(error):
            raise
    log.warning(
        "batch %d: a Python worker died while handling records; running the batch again "
        "with each handler call in its own process",
        plan.batch_id,
    )
    return _run_tasks(df, replace(plan, isolate=True))


def _with_batch(template: TaskPlan, batch_id: int, now_ms: int, staging_dir: str) -> TaskPlan:
    return replace(template, batch_id=batch_id, now_ms=now_ms, staging_dir=staging_dir)


def _summary(result: BatchResult) -> dict[str, Any]:
    return {
        "batch_id": result.batch_id,
        "replayed": result.replayed,
        "duration_ms": result.duration_ms,
        "produced": result.produced,
        **result.counters,
    }
