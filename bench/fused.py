"""Experiment: reading Kafka and routing records in ONE Python pass per task.

Today each retrylib task runs two Python passes: the Python data source's `read()` (one
worker) hands Arrow batches to the JVM, which converts them to rows and back to Arrow for
the `mapInArrow` routing task (another worker). Here the Spark job's input is just the
offset ranges (one row per task) and a single `mapInArrow` both reads its range with
retrylib's own `read_range` and routes it with retrylib's own `TaskRouter`, so the bytes
never cross into the JVM. The driver then commits the output files to Delta as the router
does. There is no streaming engine here (no offset log, no triggers): the numbers are what
the read+route+commit path costs when fused, to weigh the idea in DESIGN.md.

    python -m bench.fused CONFIG RESULT_JSON --master local[2] --cap N

Writes a result in the shape of bench.retrylib_driver's, so bench/run.py reports it alike.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import replace
from functools import partial


def fused_task(plan, bootstrap: str, options: dict, batches):
    """The `mapInArrow` body: read each offset range in the input and route its records."""
    from retrylib.batch_task import TaskRouter
    from retrylib.kafka_source import KafkaInputPartition, read_range

    router = TaskRouter(plan)
    for batch in batches:
        for row in batch.to_pylist():
            part = KafkaInputPartition(
                row["topic"], row["partition"], row["start"], row["end"], bootstrap, options
            )
            for records in read_range(part):
                router.route(records)
    yield from router.finish()


def plan_batches(low: dict, high: dict, cap: int) -> list[list[tuple[str, int, int, int]]]:
    """Offset ranges per batch: at most `cap` records a batch, split evenly over partitions."""
    per = max(-(-cap // max(len(high), 1)), 1)  # ceil: no straggler batch of a few records
    position = dict(low)
    batches = []
    while any(position[k] < high[k] for k in high):
        ranges = []
        for (topic, partition), end in sorted(high.items()):
            start = position[(topic, partition)]
            stop = min(start + per, end)
            if stop > start:
                ranges.append((topic, partition, start, stop))
                position[(topic, partition)] = stop
        batches.append(ranges)
    return batches


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench.fused")
    p.add_argument("config")
    p.add_argument("result")
    p.add_argument("--master", default="local[2]")
    p.add_argument("--cap", type=int, default=250_000)
    args = p.parse_args(argv)
    started = time.time()

    from confluent_kafka import TopicPartition

    from bench.procmem import cpu_between, tree_cpu_by_group
    from retrylib.batch_task import SUMMARY_DDL
    from retrylib.config import load_config
    from retrylib.delta_sink import DataFile, commit_files, ensure_table
    from retrylib.job import prepare_topics, task_plan
    from retrylib.kafka_client import make_consumer
    from retrylib.logs import configure_logging
    from retrylib.session import build_spark_session

    configure_logging()
    config = load_config(args.config)
    spark = build_spark_session(f"fused-{config.job.name}", master=args.master)
    session_ready = time.time()
    cpu_before = tree_cpu_by_group(os.getpid())
    partitions = prepare_topics(config)
    schema = config.handler.output_schema.to_arrow()
    ensure_table(config.output.table, schema, "output")
    template = task_plan(config, partitions)
    bootstrap, options = config.kafka.bootstrap_servers, dict(config.kafka.options)
    consumer = make_consumer(bootstrap, options)
    low, high = {}, {}
    for topic in config.kafka.topics:
        for p_id in consumer.list_topics(topic, timeout=10).topics[topic].partitions:
            lo, hi = consumer.get_watermark_offsets(TopicPartition(topic, p_id), timeout=10)
            low[(topic, p_id)], high[(topic, p_id)] = lo, hi
    consumer.close()
    query_started = time.time()
    batches = []
    for batch_id, ranges in enumerate(plan_batches(low, high, args.cap)):
        t = time.monotonic()
        plan = replace(
            template,
            batch_id=batch_id,
            now_ms=int(time.time() * 1000),
            staging_dir=os.path.join(config.job.checkpoint, "staged", str(batch_id)),
        )
        rdd = spark.sparkContext.parallelize(ranges, len(ranges))
        frame = spark.createDataFrame(rdd, "topic STRING, partition INT, start LONG, end LONG")
        task = partial(fused_task, plan, bootstrap, options)
        summary = frame.mapInArrow(task, SUMMARY_DDL).collect()
        counters: dict[str, int] = {}
        files = []
        for row in summary:
            if row.kind == "counters":
                for k, v in json.loads(row.payload).items():
                    counters[k] = counters.get(k, 0) + v
            elif row.kind == "output":
                files.append(DataFile.from_json(row.payload))
        route_ms = (time.monotonic() - t) * 1000
        c = time.monotonic()
        commit_files(config.output.table, schema, files, app_id=config.job.name, batch_id=batch_id)
        commit_ms = (time.monotonic() - c) * 1000
        batches.append(
            {
                "batch_id": batch_id,
                "end": time.time(),
                "duration_ms": round((time.monotonic() - t) * 1000),
                "produced": 0,
                "counters": counters,
                "driver_ms": {"route_job": round(route_ms), "delta_commits": round(commit_ms)},
            }
        )
    done = time.time()
    result = {
        "started": started,
        "session_ready": session_ready,
        "query_started": query_started,
        "done": done,
        "batches": batches,
        "progress": [],
        "succeeded": sum(b["counters"].get("succeeded", 0) for b in batches),
        "query_cpu_s": cpu_between(cpu_before, tree_cpu_by_group(os.getpid())),
        "error": None,
    }
    with open(args.result, "w") as f:
        json.dump(result, f)
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
