"""The embedded demo: broker, topic, sample orders, the job, and what landed in Delta.

Runs everything on this machine: an embedded Apache Kafka broker, local Spark (its tasks
reading Kafka with retrylib's own source), and Delta tables written by delta-spark under
`workdir`. Sample orders include
transient failures (retried after a delay), poison orders (dead-lettered once out of
attempts) and one unreadable record (dead-lettered at once as non-retryable).

The console tells that story: one line per batch in words, then the tables. Everything else
the processes write (retrylib's log with each batch's JSON metrics line, Spark's JVM and its
Python workers, which inherit this process's stderr) goes to `demo.log` in `workdir`, whose
path the demo prints first.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

from retrylib.batch.result import BatchResult
from retrylib.config.loader import load_config
from retrylib.dev.broker import EmbeddedBroker
from retrylib.kafka.clients import ensure_topics, make_admin, make_producer
from retrylib.retry.outcomes import RETRIED_TIER_PREFIX, Count

log = logging.getLogger(__name__)

_HANDLERS = Path(__file__).resolve().parents[2] / "examples"  # the demo handler's project
_TOPIC = "orders"
_DEMO_CONFIG = """
[job]
name = "orders-demo"
checkpoint = "{workdir}/checkpoint"
trigger = "1s"

[kafka]
bootstrap_servers = "{bootstrap}"
topics = ["{topic}"]
starting_offsets = "earliest"

[handler]
function = "orders_handlers.handlers:enrich_order"
output_schema = "order_id STRING, customer STRING, total DOUBLE, currency STRING"
paths = ["{handlers}"]

[output]
table = "{workdir}/tables/orders"

[retry]
delays = ["2s", "4s"]
max_attempts = 3
jitter = "10%"

[dead_letter]
table = "{workdir}/tables/orders_dead_letter"
"""


def sample_orders(count: int) -> list[tuple[bytes, bytes]]:
    """(key, value) pairs: every 7th order is flaky, every 25th is poison, the last unreadable."""
    orders = []
    for i in range(count - 1):
        order = {
            "order_id": f"o-{i:05d}",
            "customer": f"c-{i % 13}",
            "currency": "EUR",
            "items": [{"sku": f"sku-{i % 5}", "qty": 1 + i % 3, "price": 2.5 + i % 7}],
        }
        if i % 25 == 24:
            order["poison"] = True
        elif i % 7 == 6:
            order["flaky"] = 1 + i % 2  # succeeds on attempt 1 or 2
        orders.append((order["order_id"].encode(), json.dumps(order).encode()))
    orders.append((b"o-broken", b"{not json"))
    return orders


def _produce(bootstrap: str, orders: list[tuple[bytes, bytes]]) -> None:
    producer = make_producer(bootstrap, {})
    for key, value in orders:
        producer.produce(_TOPIC, key=key, value=value, headers=[("source", b"demo")])
    producer.flush(30)


def run_demo(records: int = 200, workdir: str = ".retrylib/demo", timeout: float = 180) -> int:
    """Run the demo end to end and print the results; returns 0, or 1 if it did not settle."""
    from retrylib.job import start_query, stop_gracefully
    from retrylib.spark.session import build_spark_session

    root = Path(workdir).resolve()
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    log_path = root / "demo.log"
    print(f"log (Spark's warnings, each batch's metrics): {log_path}")
    with _stderr_to(log_path), EmbeddedBroker(data_dir=root / "broker") as broker:
        config_path = root / "demo.toml"
        config_path.write_text(
            _DEMO_CONFIG.format(
                workdir=root, bootstrap=broker.bootstrap_servers, topic=_TOPIC, handlers=_HANDLERS
            )
        )
        config = load_config(config_path)
        ensure_topics(make_admin(broker.bootstrap_servers, {}), {_TOPIC: 3}, create=True)
        orders = sample_orders(records)
        _produce(broker.bootstrap_servers, orders)
        print(f"produced {len(orders)} orders to topic {_TOPIC!r} on {broker.bootstrap_servers}")

        settled: list[int] = [0]

        def count(result: BatchResult) -> None:
            settled[0] += result.counters.get(Count.SUCCEEDED, 0)
            settled[0] += result.counters.get(Count.DEAD_LETTERED, 0)
            if story := batch_story(result.counters):
                print(f"batch {result.batch_id}: {story}", flush=True)

        spark = build_spark_session("retrylib-demo", master="local[2]")
        query, batch_commit = start_query(spark, config, on_result=count)
        deadline = time.monotonic() + timeout
        try:
            while settled[0] < len(orders) and time.monotonic() < deadline and query.isActive:
                time.sleep(0.5)
        finally:
            stop_gracefully(query, batch_commit)
            batch_commit.close()
        landed = _print_results(spark, config.output.table, config.dead_letter.table)
        spark.stop()
    wanted = sorted(key.decode() for key, _ in orders)
    if landed != wanted:
        missing, doubled = set(wanted) - set(landed), len(landed) - len(set(landed))
        print(
            f"demo did not settle: {len(wanted) - len(missing)} of {len(wanted)} orders "
            f"accounted for, {doubled} written twice (see {log_path})"
        )
        return 1
    print(f"all {len(orders)} orders accounted for: output or dead letter, each exactly once")
    return 0


def batch_story(counters: Mapping[str, int]) -> str:
    """A batch's counters in words ("200 new orders read; 165 handled, 34 sent to retry tier 1,
    1 dead-lettered"); empty for a batch that read nothing."""
    read = [
        f"{counters[name]} {what} read"
        for name, what in ((Count.RECORDS_MAIN, "new orders"), (Count.RECORDS_RETRY, "retries"))
        if counters.get(name)
    ]
    if not read:
        return ""
    outcomes = [f"{counters.get(Count.SUCCEEDED, 0)} handled"]
    tiers = sorted(
        (int(name[len(RETRIED_TIER_PREFIX) :]), count)
        for name, count in counters.items()
        if name.startswith(RETRIED_TIER_PREFIX)
    )
    outcomes += [f"{count} sent to retry tier {number}" for number, count in tiers]
    if counters.get(Count.DEAD_LETTERED):
        outcomes.append(f"{counters[Count.DEAD_LETTERED]} dead-lettered")
    return f"{' and '.join(read)}; {', '.join(outcomes)}"


@contextlib.contextmanager
def _stderr_to(path: Path) -> Iterator[None]:
    """Send this process's stderr (file descriptor 2) to `path` meanwhile: log lines, and what
    the JVM and Spark's Python workers started meanwhile write there for their whole life."""
    sys.stderr.flush()
    saved = os.dup(2)
    with open(path, "ab") as log_file:
        os.dup2(log_file.fileno(), 2)
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)


def _print_results(spark, output_table: str, dead_letter_table: str) -> list[str]:
    """Print both tables; return the order ids found in them, sorted (repeats kept)."""

    def read_table(path: str):
        return spark.read.format("delta").load(path).toArrow()

    output = read_table(output_table)
    print(f"\noutput table {output_table}: {output.num_rows} rows; first 5:")
    print(output.sort_by("order_id").slice(0, 5).to_pandas().to_string(index=False))
    dead = read_table(dead_letter_table)
    print(f"\ndead-letter table {dead_letter_table}: {dead.num_rows} rows:")
    columns = ["origin_offset", "attempts", "reason", "error_class", "error_message"]
    table = dead.select(["key", *columns]).sort_by("origin_offset")
    frame = table.to_pandas()
    frame["key"] = [k.decode(errors="replace") for k in frame["key"]]
    frame["error_message"] = frame["error_message"].str.slice(0, 40)
    print(frame.to_string(index=False))
    return sorted([*output.column("order_id").to_pylist(), *frame["key"]])
