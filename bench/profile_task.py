"""retrylib's executor-side Python, timed and profiled without Spark.

    python -m bench.profile_task route [--records 100000] [--failure-rate 0.05] [--profile]
    python -m bench.profile_task read  [--records 200000] [--partitions 6] [--profile]
    python -m bench.profile_task ranges [--records 200000] [--partitions 6] [--profile]

`route` feeds synthetic RecordBatches in the source's exact Arrow schema through
`retrylib.task.routing.run_task` (what each `mapInArrow` task runs: per-record routing, the
handler, result rows for Spark to stage) and, for comparison, through a bare loop that only
converts the columns and calls the handler. `read` produces records to an embedded broker and reads
them back with `retrylib.source.range_reader.read_range` (what a source task emitting records
runs). `ranges` produces likewise and runs `run_task` on offset ranges, as the job's tasks
do: read and route in one pass. All print microseconds per record; `--profile` adds the
top functions by own time (cProfile).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import pyarrow as pa

from bench.data import make_value, marked_to_fail
from bench.handlers import HANDLERS, OUTPUT_DDL

REPO = Path(__file__).resolve().parents[1]


def synthetic_batches(records: int, rate: float, size: int, rows: int = 10_000):
    from retrylib.kafka.arrow_records import KAFKA_ARROW_SCHEMA

    now_us = int(time.time() * 1_000_000)
    batches = []
    for start in range(0, records, rows):
        n = min(rows, records - start)
        idx = range(start, start + n)
        columns = {
            "key": [b"k%d" % i for i in idx],
            "value": [make_value(i, size, marked_to_fail(i, rate)) for i in idx],
            "topic": ["bench-main"] * n,
            "partition": [0] * n,
            "offset": list(idx),
            "timestamp": [now_us] * n,
            "timestampType": [0] * n,
            "headers": [[] for _ in idx],
        }
        batches.append(
            pa.RecordBatch.from_arrays(
                [pa.array(columns[f.name], type=f.type) for f in KAFKA_ARROW_SCHEMA],
                schema=KAFKA_ARROW_SCHEMA,
            )
        )
    return batches


def make_plan(workdir: Path, handler: str):
    from retrylib.config.loader import load_config
    from retrylib.job.handler_job import task_plan
    from tests.helpers import write_job_toml

    config_path = write_job_toml(
        workdir / "profile.toml",
        topics=["bench-main"],
        name="profile",
        bootstrap_servers="127.0.0.1:1",
        handler={
            "function": f"bench.handlers:{handler}",
            "output_schema": OUTPUT_DDL,
            "paths": [REPO],
        },
        retry={"delays": ["10s"], "max_attempts": 2},
        dead_letter={"topic": "bench-main.dlt", "table": f"{workdir}/dead_letter"},
    )
    config = load_config(config_path)
    partitions = {t: 6 for tier in config.retry.tiers for t in tier.topics.values()}
    partitions[config.dead_letter.topic] = 6
    return replace(
        task_plan(config, partitions, b"bench"), batch_id=1, now_ms=int(time.time() * 1000)
    )


def bare_loop(handler, batches) -> int:
    """The least any per-record Python path must do: columns to Python, one call each."""
    from retrylib.record import Record

    n = 0
    for batch in batches:
        columns = [
            batch.column(name).to_pylist()
            for name in ("key", "value", "topic", "partition", "offset")
        ]
        rows = []
        for key, value, topic, partition, offset in zip(*columns, strict=True):
            try:
                rows.append(handler(Record(key, value, [], topic, partition, offset, 0, 0)))
            except Exception:
                pass
            n += 1
    return n


def profiled(function, *args, top: int, enabled: bool):
    if not enabled:
        return function(*args), ""
    profiler = cProfile.Profile()
    result = profiler.runcall(function, *args)
    out = io.StringIO()
    pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(top)
    return result, out.getvalue()


def route(args: argparse.Namespace) -> None:
    from retrylib.task.routing import run_task

    batches = synthetic_batches(args.records, args.failure_rate, args.record_bytes)
    for name in ("trivial", "flaky"):
        with tempfile.TemporaryDirectory() as tmp:
            plan = make_plan(Path(tmp), name)
            list(run_task(plan, iter(batches[:1])))  # warm: imports, handler load
            t = time.perf_counter()
            list(run_task(replace(plan, batch_id=2), iter(batches)))
            routed = time.perf_counter() - t
            _, report = profiled(
                lambda p: list(run_task(p, iter(batches))),
                replace(plan, batch_id=3),
                top=args.top,
                enabled=args.profile,
            )
        t = time.perf_counter()
        bare_loop(HANDLERS[name], batches)
        bare = time.perf_counter() - t
        print(
            f"{name:8} run_task {1e6 * routed / args.records:6.1f} us/record "
            f"({args.records / routed:,.0f} rec/s); bare loop {1e6 * bare / args.records:5.1f} "
            f"us/record ({args.records / bare:,.0f} rec/s)"
        )
        if report:
            print(report)


def read(args: argparse.Namespace) -> None:
    from retrylib.source.range_reader import KafkaInputPartition, read_range

    with input_on_broker(args) as bootstrap:
        per = args.records // args.partitions
        parts = [
            KafkaInputPartition("bench-main", p, 0, per, bootstrap, {})
            for p in range(args.partitions)
        ]

        def read_all() -> int:
            return sum(b.num_rows for part in parts for b in read_range(part))

        timed_run(args, "read_range", read_all, f"over {len(parts)} ranges of {per:,}")


def ranges(args: argparse.Namespace) -> None:
    from retrylib.kafka.arrow_records import RANGE_SCHEMA, to_arrow_schema
    from retrylib.task.routing import run_task

    with input_on_broker(args) as bootstrap, tempfile.TemporaryDirectory() as tmp:
        per = args.records // args.partitions
        batch = pa.RecordBatch.from_pylist(
            [
                {"topic": "bench-main", "partition": p, "startOffset": 0, "endOffset": per}
                for p in range(args.partitions)
            ],
            schema=to_arrow_schema(RANGE_SCHEMA),
        )
        plan = replace(make_plan(Path(tmp), "trivial"), bootstrap_servers=bootstrap)
        runs = iter(range(2, 100))

        def route_all() -> int:
            *_, counters = run_task(replace(plan, batch_id=next(runs)), iter([batch]))
            return json.loads(counters.column("counters")[-1].as_py())["succeeded"]

        timed_run(args, "run_task on ranges", route_all, "(read + route, trivial)")


@contextmanager
def input_on_broker(args: argparse.Namespace):
    """An embedded broker holding `--records` bench records on topic bench-main."""
    from bench.data import produce_input
    from retrylib.dev.broker import EmbeddedBroker
    from retrylib.kafka.clients import ensure_topics, make_admin

    with EmbeddedBroker() as broker:
        bootstrap = broker.bootstrap_servers
        ensure_topics(make_admin(bootstrap, {}), {"bench-main": args.partitions}, create=True)
        produce_input(
            bootstrap, "bench-main", args.records, args.partitions, args.record_bytes, 0.0
        )
        yield bootstrap


def timed_run(args: argparse.Namespace, name: str, function, detail: str) -> None:
    """Run `function` (returning a record count) once to warm up, once timed, once profiled."""
    function()
    t = time.perf_counter()
    n = function()
    seconds = time.perf_counter() - t
    _, report = profiled(function, top=args.top, enabled=args.profile)
    print(f"{name} {1e6 * seconds / n:6.1f} us/record ({n / seconds:,.0f} rec/s) {detail}")
    if report:
        print(report)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench.profile_task")
    p.add_argument("what", choices=("route", "read", "ranges"))
    p.add_argument("--records", type=int, default=100_000)
    p.add_argument("--partitions", type=int, default=6)
    p.add_argument("--record-bytes", type=int, default=200)
    p.add_argument("--failure-rate", type=float, default=0.05)
    p.add_argument("--profile", action="store_true")
    p.add_argument("--top", type=int, default=25)
    args = p.parse_args(argv)
    {"route": route, "read": read, "ranges": ranges}[args.what](args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
