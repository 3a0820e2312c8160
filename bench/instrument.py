"""Timers around retrylib's own code, for the time-split table. Nothing in retrylib changes.

Executor side: `timed_run_task` replaces `retrylib.job.handler_job.run_task` (the `mapInArrow`
body the job gives a handler job's batch commit) with a wrapper that calls the original and
times, per task:

- `bench_source_wait_ms`: waiting for the next input batch. With Spark's Kafka source that
  is the JVM reading Kafka and handing the records over as Arrow; with the Python source
  (offset ranges) the input is a few ranges and the reading is inside the task, counted
  by retrylib itself as `kafka_read_ms`.
- `bench_handoff_ms`: handing result rows back to Spark (the time a `yield` takes: Arrow
  serialisation to the JVM, and waiting while the JVM writes the staging Parquet).
- `bench_task_ms`: the whole task.

It adds them to the task's counters row, so the batch commit sums them per batch like its own
counters. Handler time is retrylib's own `handler_ms` counter; the rest of the task is
retrylib's per-record routing.

Driver side: `install_driver_timers` wraps the steps of the batch commit's `foreachBatch` body
with timers keyed by step (see `DRIVER_STEPS`). Overhead: two `perf_counter` calls per
Arrow batch and per step.
"""

from __future__ import annotations

import json
import logging
import time
from collections import defaultdict
from collections.abc import Iterator

import pyarrow as pa

log = logging.getLogger("bench.instrument")

DRIVER_STEPS = {
    "stage": "the routing stage: the route and the first batch's check at once (RoutingStage.run)",
    "route": "routing the batch and counting its decisions (RoutingStage._route)",
    "staging_write": "Spark job: handler tasks + staging Parquet write (routing_stage._run_tasks)",
    "manifest": "claiming the manifest (routing_stage.claim_json)",
    "apply": "the batch's effects (effects.make_effects)",
    "produce": "Spark job: executors produce the retry/dead-letter records (KafkaProduce._produce)",
    "delta_appends": "Delta appends with txnAppId/txnVersion (table_appends.append_once)",
    "clean_up": "dropping old staging folders and manifests (Checkpoint.clean_up)",
    "check_tables": "first batch: are the tables or control topic ahead of the checkpoint",
    "metrics": "per-batch metrics line and input lag (MetricsRecorder.record)",
}


def timed_run_task(plan, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """`retrylib.task.routing.run_task` with per-task timers added to its counters row."""
    from retrylib.task import routing

    clock = time.perf_counter
    started = clock()
    waited = [0.0]
    rows = [0]

    def timed_batches() -> Iterator[pa.RecordBatch]:
        source = iter(batches)
        while True:
            t = clock()
            batch = next(source, None)
            waited[0] += clock() - t
            if batch is None:
                return
            rows[0] += batch.num_rows
            yield batch

    handed = 0.0
    for out in routing.run_task(plan, timed_batches()):
        if _is_counters_row(out):
            out = _add_counters(
                out,
                {
                    "bench_task_ms": round((clock() - started) * 1000),
                    "bench_source_wait_ms": round(waited[0] * 1000),
                    "bench_handoff_ms": round(handed * 1000),
                    "bench_tasks": 1,
                    "bench_task_rows": rows[0],
                },
            )
        t = clock()
        yield out
        handed += clock() - t


def _is_counters_row(batch: pa.RecordBatch) -> bool:
    kinds = batch.column("kind")
    return batch.num_rows > 0 and kinds[batch.num_rows - 1].as_py() == "counters"


def _add_counters(rows: pa.RecordBatch, extra: dict[str, int]) -> pa.RecordBatch:
    """`rows` (result rows, `retrylib.task.results`) with `extra` added to its counters row's JSON,
    or a counters row appended when it has none."""
    table = rows.to_pylist()
    for row in table:
        if row["kind"] == "counters":
            counters = json.loads(row["counters"])
            for key, value in extra.items():
                counters[key] = counters.get(key, 0) + value
            row["counters"] = json.dumps(counters)
            extra = {}
    if extra:
        table.append({"kind": "counters", "counters": json.dumps(extra)})
    return pa.RecordBatch.from_pylist(table, schema=rows.schema)


class DriverTimers:
    """Milliseconds per driver-side step since the last `take()`."""

    def __init__(self) -> None:
        self.ms: dict[str, float] = defaultdict(float)

    def take(self) -> dict[str, int]:
        taken = {key: round(value) for key, value in self.ms.items()}
        self.ms.clear()
        return taken

    def wrap(self, owner, name: str, step: str) -> bool:
        """Time `owner.name` under `step`; False (and nothing wrapped) when it is missing,
        as retrylib's internals may have moved on since this was written."""
        original = getattr(owner, name, None)
        if original is None:
            return False
        timers = self.ms

        def timed(*args, **kwargs):
            t = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                timers[step] += (time.perf_counter() - t) * 1000

        timed.__wrapped__ = original
        setattr(owner, name, timed)
        return True


def install_driver_timers() -> DriverTimers:
    """Route tasks through `timed_run_task` and time the batch commit's steps."""
    from retrylib.batch import (
        commit,
        effect_targets,
        metrics,
        produce_units,
        routing_stage,
        table_appends,
    )
    from retrylib.job import handler_job
    from retrylib.state import checkpoint

    if not hasattr(handler_job, "run_task"):
        raise RuntimeError("retrylib.job.handler_job.run_task is gone: update bench/instrument.py")
    handler_job.run_task = timed_run_task
    timers = DriverTimers()
    targets = [
        (routing_stage.RoutingStage, "run", "stage"),
        (routing_stage.RoutingStage, "_route", "route"),
        (routing_stage, "_run_tasks", "staging_write"),
        (routing_stage, "claim_json", "manifest"),
        (commit, "make_effects", "apply"),
        (produce_units.KafkaProduce, "_produce", "produce"),
        (table_appends, "append_once", "delta_appends"),
        (checkpoint.Checkpoint, "clean_up", "clean_up"),
        (effect_targets.EffectTargets, "_check_agree", "check_tables"),
        (metrics.MetricsRecorder, "record", "metrics"),
    ]
    missing = [
        f"{getattr(owner, '__name__', owner)}.{name}"
        for owner, name, step in targets
        if not timers.wrap(owner, name, step)
    ]
    if missing:
        log.warning("retrylib steps not found, their times read 0: %s", ", ".join(missing))
    return timers
