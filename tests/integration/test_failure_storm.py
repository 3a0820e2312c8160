"""A failure storm: every record of a large backlog fails at once, and the job, run through
spark-submit.sh with a small driver, must stage and produce every one of them to the first
retry tier.

The backlog is RECORDS records of RECORD_BYTES bytes on a main topic, the handler
(`storm_handlers:service_down`) raises ConnectionError for every record, the tiers' delays
are so long that nothing comes back during the run, and no `max_offsets_per_trigger` caps
the batch: the whole backlog is one batch, and every record of it a retry record to produce.
The job runs as a user runs it, `./spark-submit.sh CONF --available-now`, with
`--driver-memory DRIVER_MEMORY` (local mode: the driver JVM is also the executor).

On commit d9cd6ce the router collects every outgoing retry record into the driver
(`BatchCommit._apply`: `toArrow()`) and produces them from one driver-side producer. At this
size, 100,000 records x 1 KB with a 512m driver, that fails in 3 runs out of 3: a task of
the `toArrow()` collect (stage 18 of batch 0) runs out of heap serializing the outgoing
records it collected as its result for the driver, `java.lang.OutOfMemoryError: Java heap
space`, Spark's uncaught-exception handler ends the JVM and spark-submit.sh exits 52, with
batch 0 unfinished and nothing produced to the retry tier. At 200,000 a task of the same
stage ran out of heap writing its Arrow batches (the stack names
`Dataset.collectAsArrowToPython`); at 50,000 it failed once (OutOfMemoryError fetching the
task results, TaskResultLost, exit 1) and passed once; at 37,500 and 25,000 it passed. (The
issue saw the OOM at 400,000 x 1 KB with Spark's default driver memory.) 512m is about the
least a driver can have (Spark refuses a heap under 450 MiB: INVALID_DRIVER_MEMORY), so the
size is 2x the smallest one seen failing. With executors producing the outgoing records, the
driver holds none of them, and the test passes.

RETRYLIB_STORM_RECORDS and RETRYLIB_STORM_DRIVER_MEMORY override the size, to reproduce at
another one.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections import Counter
from pathlib import Path

import pytest
from confluent_kafka import Producer
from helpers import job_env

from retrylib.kafka.clients import make_consumer, topic_partitions
from retrylib.kafka.reading import READ_TO_END_OPTIONS, ReadToEnd, watermarks
from retrylib.retry.headers import ATTEMPT, ID, record_id

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]

RECORDS = int(os.environ.get("RETRYLIB_STORM_RECORDS", "100000"))
RECORD_BYTES = 1000
DRIVER_MEMORY = os.environ.get("RETRYLIB_STORM_DRIVER_MEMORY", "512m")
PARTITIONS = 2


def produce_backlog(bootstrap: str, topic: str, records: int, partitions: int) -> None:
    """`records` records of RECORD_BYTES random (incompressible) bytes, keyed storm-<i>,
    round-robin over `partitions`, produced in large batches."""
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "linger.ms": 50,
            "batch.size": 1_000_000,
            "batch.num.messages": 10_000,
            "queue.buffering.max.messages": 200_000,
            "queue.buffering.max.kbytes": 512 * 1024,
        }
    )
    noise = os.urandom(RECORD_BYTES * 1024)
    for i in range(records):
        start = (i * 7919) % (len(noise) - RECORD_BYTES)
        while True:
            try:
                producer.produce(
                    topic,
                    key=b"storm-%d" % i,
                    value=noise[start : start + RECORD_BYTES],
                    partition=i % partitions,
                )
                break
            except BufferError:
                producer.poll(0.05)
    assert producer.flush(120) == 0, f"backlog not fully delivered to {topic}"


def committed_ids_and_attempts(bootstrap: str, topic: str) -> Counter[tuple[str, str]]:
    """(retrylib.id, retrylib.attempt) of every record of `topic` a read_committed reader
    sees, counted; only those two headers are kept, not the records."""
    consumer = make_consumer(bootstrap, dict(READ_TO_END_OPTIONS))
    try:
        partitions = topic_partitions(consumer, [topic]).get(topic, [])
        read = ReadToEnd.from_earliest(consumer, [(topic, p) for p in partitions])
        seen: Counter[tuple[str, str]] = Counter()
        for message in read.messages(timeout_s=300):
            headers = dict(message.headers() or [])
            seen[(_text(headers.get(ID)), _text(headers.get(ATTEMPT)))] += 1
    finally:
        consumer.close()
    assert not read.unfinished, f"{topic} not read to its end"
    return seen


def _text(value: bytes | None) -> str:
    return "<none>" if value is None else value.decode()


def main_topic_ids(bootstrap: str, job: str, topic: str) -> set[str]:
    """The retrylib.id of every record on `topic` (a fresh topic written by one producer
    without transactions: every offset below the high watermark holds a record)."""
    consumer = make_consumer(bootstrap, {})
    try:
        marks = watermarks(consumer, [(topic, p) for p in range(PARTITIONS)])
    finally:
        consumer.close()
    return {
        record_id(job, topic, partition, offset)
        for (_, partition), (low, high) in marks.items()
        for offset in range(low, high)
    }


def test_a_failure_storm_stages_every_record_to_the_first_tier_once(
    bootstrap_servers, make_topic, write_config, tmp_path
):
    topic = make_topic("storm", partitions=PARTITIONS)
    started = time.monotonic()
    produce_backlog(bootstrap_servers, topic, RECORDS, PARTITIONS)
    produced_s = time.monotonic() - started
    expected = main_topic_ids(bootstrap_servers, "storm", topic)
    assert len(expected) == RECORDS
    config = write_config(
        [topic],
        name="storm",
        handler="storm_handlers:service_down",
        # Nothing comes back during the run: the first tier's records are due in an hour.
        retry={"delays": ["1h", "2h"], "max_attempts": 3},
    )
    assert config.kafka.max_offsets_per_trigger is None  # the backlog is one batch
    env = job_env({"RETRYLIB_SPARK_EXTRA": f"--master local[2] --driver-memory {DRIVER_MEMORY}"})
    log_path = tmp_path / "job.log"
    with log_path.open("w") as log:
        done = subprocess.run(
            [str(REPO / "spark-submit.sh"), config.source_path, "--available-now"],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            timeout=900,
        )
    output = log_path.read_text(errors="replace")
    print(
        f"storm: {RECORDS:,} records x {RECORD_BYTES} B produced in {produced_s:.1f}s; "
        f"job ({DRIVER_MEMORY} driver) exit {done.returncode} after "
        f"{time.monotonic() - started - produced_s:.1f}s; log {log_path}"
    )

    checks = time.monotonic()
    out_of_memory = [line for line in output.splitlines() if "OutOfMemoryError" in line]
    assert not out_of_memory, (
        f"the driver ran out of memory ({DRIVER_MEMORY}, {RECORDS:,} records): "
        + "\n".join(out_of_memory[:5])
    )
    assert done.returncode == 0, output[-3000:]

    [tier_topic] = config.retry.tiers[0].topics.values()
    produced = committed_ids_and_attempts(bootstrap_servers, tier_topic)
    ids = Counter(record for record, _ in produced.elements())
    attempts = Counter(attempt for _, attempt in produced.elements())
    duplicated = sum(1 for count in ids.values() if count > 1)
    assert attempts == {"1": RECORDS}, attempts
    assert set(ids) == expected, (
        f"{len(expected - set(ids)):,} records missing from {tier_topic}, "
        f"{len(set(ids) - expected):,} unknown ids"
    )
    assert duplicated == 0, f"{duplicated:,} records produced more than once"

    assert committed_ids_and_attempts(bootstrap_servers, config.dead_letter.topic) == Counter()
    assert files_added(Path(str(config.dead_letter.table))) == 0
    print(f"storm: checked in {time.monotonic() - checks:.1f}s")


def files_added(table: Path) -> int:
    """Data files the commits of the Delta table at `table` added (0 for no table): the
    job only appends, so 0 means the table holds no row. Read from the log's JSON commits,
    without a Spark session in the test process."""
    return sum(
        "add" in json.loads(line)
        for commit in sorted((table / "_delta_log").glob("*.json"))
        for line in commit.read_text().splitlines()
        if line.strip()
    )
