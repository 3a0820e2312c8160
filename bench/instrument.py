"""Timers around retrylib's own code, for the time-share table. Nothing in retrylib changes.

Executor side: `timed_run_task` replaces `retrylib.router.run_task` (the `mapInArrow` body)
with a wrapper that calls the original and times, per task, the waits for the next input
batch (for Kafka records from the JVM; offset ranges are read inside the task, which
retrylib counts itself as `kafka_read_ms`), the Parquet writes and closes of
`DataFileWriter` ("parquet"), and the whole task. It adds them to the task's counters row,
so the router sums them per batch like its own counters (`bench_*`). Handler time is
retrylib's own `handler_ms` counter.

Driver side: `install_driver_timers` wraps the router's routing job, the staged produce,
the Delta commits, the manifest write and the clean-up with timers keyed by step.
Overhead: two `perf_counter` calls per 10,000-record Arrow batch and per step.
"""

from __future__ import annotations

import json
import logging
import time
from collections import defaultdict
from collections.abc import Iterator

import pyarrow as pa

log = logging.getLogger("bench.instrument")

_writer_ms = [0.0]
_writer_patched = [False]


def _patch_writer() -> None:
    """Time `DataFileWriter.write`/`close` in this (worker) process; done once."""
    if _writer_patched[0]:
        return
    from retrylib import delta_sink

    cls = delta_sink.DataFileWriter
    original_write, original_close = cls.write, cls.close

    def write(self, batch):
        t = time.perf_counter()
        try:
            return original_write(self, batch)
        finally:
            _writer_ms[0] += (time.perf_counter() - t) * 1000

    def close(self):
        t = time.perf_counter()
        try:
            return original_close(self)
        finally:
            _writer_ms[0] += (time.perf_counter() - t) * 1000

    cls.write, cls.close = write, close
    _writer_patched[0] = True


def timed_run_task(plan, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """`retrylib.batch_task.run_task` with per-task timers added to its counters row."""
    from retrylib import batch_task

    _patch_writer()
    started = time.perf_counter()
    writer_before = _writer_ms[0]
    waited = [0.0]
    rows = [0]

    def timed_batches() -> Iterator[pa.RecordBatch]:
        source = iter(batches)
        while True:
            t = time.perf_counter()
            try:
                batch = next(source)
            except StopIteration:
                waited[0] += time.perf_counter() - t
                return
            waited[0] += time.perf_counter() - t
            rows[0] += batch.num_rows
            yield batch

    for summary in batch_task.run_task(plan, timed_batches()):
        timers = {
            "bench_task_ms": round((time.perf_counter() - started) * 1000),
            "bench_source_wait_ms": round(waited[0] * 1000),
            "bench_parquet_ms": round(_writer_ms[0] - writer_before),
            "bench_tasks": 1,
            "bench_task_rows": rows[0],
        }
        yield _add_counters(summary, timers)


def _add_counters(summary: pa.RecordBatch, extra: dict[str, int]) -> pa.RecordBatch:
    rows = summary.to_pylist()
    for row in rows:
        if row["kind"] == "counters":
            counters = json.loads(row["payload"])
            for key, value in extra.items():
                counters[key] = counters.get(key, 0) + value
            row["payload"] = json.dumps(counters)
            extra = {}
    if extra:
        rows.append({"kind": "counters", "payload": json.dumps(extra)})
    return pa.RecordBatch.from_pylist(rows, schema=summary.schema)


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
    """Route tasks through `timed_run_task` and time the router's driver-side steps."""
    from retrylib import router, staging

    if not hasattr(router, "run_task"):
        raise RuntimeError("retrylib.router.run_task is gone: update bench/instrument.py")
    router.run_task = timed_run_task
    timers = DriverTimers()
    wrapped = [
        timers.wrap(router.BatchRouter, "_route", "route_job"),
        timers.wrap(staging.StagedProducer, "produce_once", "produce"),
        timers.wrap(router, "commit_files", "delta_commits"),
        timers.wrap(router, "write_json", "manifest"),
        timers.wrap(router.BatchRouter, "_clean_up", "clean_up"),
    ]
    if not all(wrapped):
        log.warning("some retrylib driver steps were not found; their times read 0")
    return timers
