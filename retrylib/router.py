"""The driver side of one micro-batch (the `foreachBatch` body).

A batch runs in steps, each safe to repeat after a crash:

1. Unless this batch already has a manifest: executors route every record (see
   `batch_task`) and write files; the driver records the files and the batch's clock in a
   manifest. The manifest is the commit point of the batch's decisions: a replay after it
   reuses them instead of calling the handler again.
2. Staged retry and dead-letter records are produced in one Kafka transaction with a
   per-batch marker, so they are produced once (`staging`).
3. The output and dead-letter files are committed to their Delta tables with the app
   transaction (job name, batch id), so they are committed once (`delta_sink`).
"""

from __future__ import annotations

import json
import logging
import time
from collections import Counter
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

from pyspark.sql import DataFrame

from retrylib.batch_task import SUMMARY_DDL, TaskPlan, run_task
from retrylib.dead_letter import DEAD_LETTER_SCHEMA
from retrylib.delta_sink import DataFile, commit_files
from retrylib.faults import crash_point
from retrylib.staging import StagedProducer
from retrylib.storage import delete_tree, join, list_names, read_json, write_json

log = logging.getLogger(__name__)

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
        self._producer = StagedProducer(plan_template.job, bootstrap_servers, kafka_options)
        self._on_result = on_result

    def __call__(self, df: DataFrame, batch_id: int) -> None:
        started = time.monotonic()
        manifest_uri = join(self._state_dir, "manifests", f"{batch_id}.json")
        manifest = read_json(manifest_uri)
        replayed = manifest is not None
        if manifest is None:
            manifest = self._route(df, batch_id)
            write_json(manifest_uri, manifest)
            crash_point("after_manifest", batch_id)
        result = self._apply(manifest, batch_id, replayed, started)
        crash_point("before_batch_end", batch_id)
        self._clean_up(batch_id)
        log.info("batch %s", json.dumps(_summary(result)))
        if self._on_result is not None:
            self._on_result(result)

    def _route(self, df: DataFrame, batch_id: int) -> dict[str, Any]:
        plan = _with_batch(
            self._template, batch_id, int(time.time() * 1000), self._staging_dir(batch_id)
        )
        summary = df.mapInArrow(partial(run_task, plan), SUMMARY_DDL).collect()
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
        job = self._template.job
        output_committed = bool(files["output"]) and commit_files(
            self._template.output_table,
            self._template.output_schema,
            files["output"],
            app_id=job,
            batch_id=batch_id,
        )
        crash_point("after_output_commit", batch_id)
        dead_committed = bool(files["dead_letter"]) and commit_files(
            self._template.dead_letter_table,
            DEAD_LETTER_SCHEMA,
            files["dead_letter"],
            app_id=job,
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

    def _staging_dir(self, batch_id: int) -> str:
        return join(self._state_dir, "staged", str(batch_id))

    def _clean_up(self, batch_id: int) -> None:
        """Drop staged files of finished batches and manifests older than the last few."""
        for name in list_names(join(self._state_dir, "staged")):
            if name.isdigit() and int(name) <= batch_id:
                delete_tree(join(self._state_dir, "staged", name))
        for name in list_names(join(self._state_dir, "manifests")):
            number = name.removesuffix(".json")
            if number.isdigit() and int(number) < batch_id - _MANIFESTS_KEPT:
                delete_tree(join(self._state_dir, "manifests", name))

    def close(self) -> None:
        self._producer.close()


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
