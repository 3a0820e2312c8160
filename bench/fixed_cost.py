"""What the `fixed_cost` part of bench/run.py reads and writes outside Spark: the broker's
end offsets and the Delta tables' versions (did a quiet job write anything?), the delay
router's input and its forwarded records, and the time from `./spark-submit.sh` to the
first batch's metrics line."""

from __future__ import annotations

import subprocess
import threading
import time
from pathlib import Path

METRICS_MARK = " retrylib.metrics: "
"""How a batch's metrics line (logger `retrylib.metrics`) shows in a job's plain-text log."""


def topic_ends(bootstrap: str) -> dict[str, int]:
    """{topic: sum of its partitions' high watermarks} of every topic of the cluster but
    Kafka's own (`__`): a record or a transaction marker written anywhere moves one."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-fixed-cost"})
    try:
        ends = {}
        for name, meta in consumer.list_topics(timeout=10).topics.items():
            if name.startswith("__"):
                continue
            ends[name] = sum(
                consumer.get_watermark_offsets(TopicPartition(name, p), timeout=10, cached=False)[1]
                for p in meta.partitions
            )
        return ends
    finally:
        consumer.close()


def delta_versions(tables: dict[str, Path]) -> dict[str, int | None]:
    """{name: current version} of each Delta table (None: no table there yet)."""
    from deltalake import DeltaTable

    versions: dict[str, int | None] = {}
    for name, path in tables.items():
        versions[name] = DeltaTable(str(path)).version() if (path / "_delta_log").exists() else None
    return versions


def produce_delayed(
    bootstrap: str, topic: str, final_topic: str, count: int, spread: float, prefix: str
) -> None:
    """`count` records to a delay topic over `spread` seconds, as a Kafka-Retry-Router
    sender writes them (headers `final_topic` and `msg_ts`, epoch seconds), each with its
    Kafka timestamp set to msg_ts's whole second, so that both say it is due at the same
    time: msg_ts + the topic's delay."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for i in range(count):
        sent_s = int(time.time())
        producer.produce(
            topic,
            key=b"%s-%d" % (prefix.encode(), i),
            value=b"x" * 200,
            headers=[("msg_ts", str(sent_s).encode()), ("final_topic", final_topic.encode())],
            timestamp=sent_s * 1000,
        )
        producer.flush(30)
        if count > 1:
            time.sleep(spread / count)
    if producer.flush(30):
        raise RuntimeError(f"records not delivered to {topic}")


def forwarded_lateness_ms(bootstrap: str, final_topic: str, delay_ms: int, prefix: str) -> list:
    """Kafka timestamp of each forwarded record (the final topic's LogAppendTime: when the
    router's produce reached the broker) - (msg_ts + delay), for the keys starting with
    `prefix`."""
    from bench.lateness import committed_messages

    values = []
    for message in committed_messages(bootstrap, final_topic):
        if not (message.key() or b"").startswith(prefix.encode()):
            continue
        sent_s = int(dict(message.headers() or ())["msg_ts"])
        values.append(message.timestamp()[1] - (sent_s * 1000 + delay_ms))
    return values


def time_to_first_batch(
    command: list[str], cwd: Path, env: dict, log_path: Path, timeout: float
) -> dict:
    """Launch `command` (the job through ./spark-submit.sh) in a session of its own, copy its
    output to `log_path`, and time launch -> the first metrics line (a batch done); then stop
    it as the soak does (`bench.soak.stop_job`: SIGTERM to its Python driver, which ends the
    job after its batch; its process group killed after 5 min). {"seconds": None} when no batch
    was done within `timeout`."""
    first: list[float] = []
    launched = time.monotonic()
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip

        def copy() -> None:
            for line in process.stdout:
                if not first and METRICS_MARK.encode() in line:
                    first.append(time.monotonic())
                log.write(line)
                log.flush()

        reader = threading.Thread(target=copy, daemon=True)
        reader.start()
        deadline = launched + timeout
        while not first and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        if process.poll() is None:
            from bench.soak import job_processes, stop_job

            stop_job(process, job_processes(process.pid))
        reader.join(10)
    return {"seconds": first[0] - launched if first else None, "exit": process.returncode}
