"""The engine's own pace: a bare Spark pipeline from Kafka to Delta, no handler, no retries.

    python -m bench.bare_driver ARGS_JSON RESULT_JSON --master local[2]

ARGS_JSON holds `bootstrap`, `topic`, `table`, `checkpoint` and `max_offsets_per_trigger`.
The pipeline is `spark.readStream.format("kafka")` on the topic, the trivial handler's
output columns computed in the JVM (`partition, offset, length(value) AS size`: the same
table retrylib writes), `writeStream.format("delta")` with `Trigger.AvailableNow` and the
same `maxOffsetsPerTrigger` as retrylib. With `handler` (a name in bench/handlers.py) the
columns come from that handler instead, called per record in a `mapInArrow` over the
connector's rows: the job a user would write by hand, with no retries. The session comes from
`retrylib.spark.session.build_spark_session`, so it has the same jars and settings. Run in a
process of its own by bench/run.py; the result JSON has the same fields as
bench/retrylib_driver.py's, batches taken from the query's progress.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time


def run_until_stopped(query, stop_file: str, events: str, timeout: float) -> None:
    """Let a processing-time query run until `stop_file` exists (or `timeout`), writing a line
    to `events` for each batch that ran as its progress appears; then stop it."""
    seen: set[int] = set()
    deadline = time.monotonic() + timeout
    with open(events, "a") as out:
        while query.isActive and time.monotonic() < deadline:
            stop = os.path.exists(stop_file)
            for p in query.recentProgress:
                if p.batchId in seen or p.numInputRows == 0:
                    continue  # an idle trigger's progress repeats the next batch's id
                seen.add(p.batchId)
                line = {"batch_id": p.batchId, "end": time.time()}
                out.write(json.dumps({**line, "counters": {"succeeded": p.numInputRows}}) + "\n")
                out.flush()
            if stop:
                break
            time.sleep(0.2)
    query.stop()


class _Record:
    """What a per-record handler reads of a Kafka record here."""

    __slots__ = ("offset", "partition", "value")

    def __init__(self, partition: int, offset: int, value: bytes) -> None:
        self.partition, self.offset, self.value = partition, offset, value


def per_record(name: str):
    """A `mapInArrow` function calling bench.handlers' `name` on each record's row."""

    def handle(batches):
        import pyarrow as pa

        from bench import handlers

        handler = getattr(handlers, name)
        schema = pa.schema(
            [("partition", pa.int32()), ("offset", pa.int64()), ("size", pa.int32())]
        )
        for batch in batches:
            rows = [handler(_Record(**row)) for row in batch.to_pylist()]
            yield pa.RecordBatch.from_pylist(rows, schema=schema)

    return handle


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("args_json")
    parser.add_argument("result")
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--timeout", type=float, default=600.0)
    args = parser.parse_args(argv)
    options = json.loads(args.args_json)
    started = time.time()

    from pyspark.sql import functions as F

    from bench.procmem import cpu_between, tree_cpu_by_group
    from bench.retrylib_driver import progress_of, query_error
    from retrylib.spark.session import build_spark_session

    spark = build_spark_session("bench-bare", master=args.master)
    session_ready = time.time()
    reader = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", options["bootstrap"])
        .option("subscribe", options["topic"])
        .option("startingOffsets", "earliest")
    )
    if options.get("max_offsets_per_trigger"):
        reader = reader.option("maxOffsetsPerTrigger", str(options["max_offsets_per_trigger"]))
    records = reader.load()
    if options.get("handler"):
        frame = records.select("partition", "offset", "value").mapInArrow(
            per_record(options["handler"]), "partition INT, offset BIGINT, size INT"
        )
    else:
        frame = records.select("partition", "offset", F.length("value").cast("int").alias("size"))
    cpu_before = tree_cpu_by_group(os.getpid())
    writer = (
        frame.writeStream.format("delta")
        .queryName("bench-bare")
        .option("checkpointLocation", options["checkpoint"])
    )
    trigger = options.get("trigger")
    writer = (
        writer.trigger(processingTime=trigger) if trigger else writer.trigger(availableNow=True)
    )
    query = writer.start(options["table"])
    query_started = time.time()
    if trigger:
        run_until_stopped(query, options["stop_file"], options["events"], args.timeout)
    error = query_error(query, None if trigger else args.timeout)
    done = time.time()
    query_cpu = cpu_between(cpu_before, tree_cpu_by_group(os.getpid()))
    progress = progress_of(query)
    written = spark.read.format("delta").load(options["table"]).count()
    result = {
        "started": started,
        "session_ready": session_ready,
        "query_started": query_started,
        "done": done,
        "progress": progress,
        "records": sum(p["numInputRows"] or 0 for p in progress),
        "succeeded": written,
        "query_cpu_s": query_cpu,
        "error": error,
    }
    with open(args.result, "w") as f:
        json.dump(result, f)
    spark.stop()
    return 1 if error else 0


if __name__ == "__main__":
    sys.exit(main())
