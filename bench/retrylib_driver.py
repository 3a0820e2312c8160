"""Runs the retrylib job in this process (its own process, started by bench/run.py) the way
`retrylib run` does (`build_spark_session` + `start_query`), with bench timers installed
(see bench/instrument.py), and writes what happened to a JSON result file.

    python -m bench.retrylib_driver CONFIG RESULT_JSON --master local[2]
        [--continuous --expect-succeeded N --events EVENTS_JSONL --timeout S] [--no-timers]
        [--stop-file PATH] [--idle-progress-ms MS]

Without --continuous the query runs with Trigger.AvailableNow and the process exits when it
ends. With --continuous it runs on the config's processing-time trigger until the batches
have counted N succeeded records (or the timeout), appending one JSON line per batch to
EVENTS_JSONL as batches end (bench/run.py watches it to know the job is warm). With
--stop-file it also stops once that file exists (bench/run.py creates it when it has measured
what it wanted). --idle-progress-ms sets how often Spark reports the progress of a trigger that
ran no batch (`spark.sql.streaming.noDataProgressEventInterval`, 10 s by default), and keeps
up to 2000 progress entries instead of 100.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time


def progress_of(query) -> list[dict]:
    """The query's recent progress entries, reduced to what the report reads."""
    entries = [json.loads(p.json) for p in query.recentProgress]
    return [
        {
            "batchId": p.get("batchId"),
            "timestamp": p.get("timestamp"),
            "numInputRows": p.get("numInputRows"),
            "durationMs": p.get("durationMs", {}),
        }
        for p in entries
    ]


def query_error(query, available_now_timeout: float | None) -> str | None:
    """The error the query ended with, as text, or None. An availableNow query (given
    `available_now_timeout`) is first given that many seconds to end by itself, and stopped
    if it has not."""
    error = None
    if available_now_timeout is not None:
        query.awaitTermination(available_now_timeout)
        if query.isActive:
            error = f"timed out after {available_now_timeout}s"
            query.stop()
    exception = query.exception()
    return error if exception is None else str(exception)


def jvm_heap(spark) -> dict:
    """The driver JVM's heap limit and its old generation's peak (`bench.report.heap_figures`),
    read from its memory pools over py4j; empty when the JVM does not answer."""
    from bench.report import heap_figures

    try:
        factory = spark.sparkContext._jvm.java.lang.management.ManagementFactory
        pools = [
            (
                str(pool.getName()),
                str(pool.getType().name()) == "HEAP",
                int(pool.getPeakUsage().getUsed()),
            )
            for pool in factory.getMemoryPoolMXBeans()
        ]
        return heap_figures(pools, int(factory.getMemoryMXBean().getHeapMemoryUsage().getMax()))
    except Exception:  # a JVM that is going away (after an OutOfMemoryError, say)
        return {}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("config")
    parser.add_argument("result")
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--continuous", action="store_true")
    parser.add_argument("--expect-succeeded", type=int, default=0)
    parser.add_argument("--events")
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument("--no-timers", action="store_true")
    parser.add_argument("--stop-file")
    parser.add_argument("--idle-progress-ms", type=int)
    args = parser.parse_args(argv)
    started = time.time()

    from retrylib.config.loader import load_config
    from retrylib.job import start_query, stop_gracefully
    from retrylib.logs import configure_logging
    from retrylib.spark.session import build_spark_session

    configure_logging()
    config = load_config(args.config)
    timers = None
    if not args.no_timers:
        from bench.instrument import install_driver_timers

        timers = install_driver_timers()
    spark = build_spark_session(f"retrylib-{config.job.name}", master=args.master)
    session_ready = time.time()
    if args.idle_progress_ms is not None:
        spark.conf.set(
            "spark.sql.streaming.noDataProgressEventInterval", str(args.idle_progress_ms)
        )
        # ...and keeps them all: the report reads the whole run's progress.
        spark.conf.set("spark.sql.streaming.numRecentProgressUpdates", "2000")

    batches: list[dict] = []
    succeeded = [0]
    settled = threading.Event()
    events = open(args.events, "a") if args.events else None

    def on_result(result) -> None:
        entry = {
            "batch_id": result.batch_id,
            "end": time.time(),
            "duration_ms": result.duration_ms,
            "replayed": result.replayed,
            "produced": result.produced,
            "counters": result.counters,
            "driver_ms": timers.take() if timers else {},
        }
        batches.append(entry)
        succeeded[0] += result.counters.get("succeeded", 0)
        if events is not None:
            events.write(json.dumps(entry) + "\n")
            events.flush()
        if args.expect_succeeded and succeeded[0] >= args.expect_succeeded:
            settled.set()

    from bench.procmem import cpu_between, tree_cpu_by_group

    cpu_before = tree_cpu_by_group(os.getpid())
    query, router = start_query(
        spark, config, available_now=not args.continuous, on_result=on_result
    )
    query_started = time.time()
    try:
        if args.continuous:
            deadline = time.monotonic() + args.timeout
            while query.isActive and not settled.is_set() and time.monotonic() < deadline:
                if args.stop_file and os.path.exists(args.stop_file):
                    break
                settled.wait(0.2)
            stop_gracefully(query, router)
        error = query_error(query, None if args.continuous else args.timeout)
    finally:
        router.close()
    done = time.time()
    query_cpu = cpu_between(cpu_before, tree_cpu_by_group(os.getpid()))
    result = {
        "started": started,
        "session_ready": session_ready,
        "query_started": query_started,
        "done": done,
        "batches": batches,
        "progress": progress_of(query),
        "succeeded": succeeded[0],
        "query_cpu_s": query_cpu,
        "jvm_heap": jvm_heap(spark),
        "error": error,
    }
    with open(args.result, "w") as f:
        json.dump(result, f)
    if events is not None:
        events.close()
    spark.stop()
    return 1 if error else 0


if __name__ == "__main__":
    sys.exit(main())
