"""The benchmark input: N records of a fixed size over P partitions, a share marked to fail."""

from __future__ import annotations

import time

from bench.handlers import DEAD_MARK, FAIL_MARK, OK_MARK


def marked_to_fail(index: int, rate: float) -> bool:
    """True for an evenly spread `rate` share of record indexes (deterministic, no RNG).

    Record i is marked when floor((i + 1) * rate) > floor(i * rate), so any prefix of n
    records holds floor(n * rate) marked ones.
    """
    if rate <= 0:
        return False
    if rate >= 1:
        return True
    return int((index + 1) * rate) > int(index * rate)


def soak_mark(index: int, fail_rate: float, dead_rate: float) -> bytes:
    """The marker of record `index` in the soak: `DEAD_MARK` for an evenly spread
    `dead_rate` share, else `FAIL_MARK` for a `fail_rate` share (of all indexes, so a little
    less where both pick one), else `OK_MARK`."""
    if marked_to_fail(index, dead_rate):
        return DEAD_MARK
    return FAIL_MARK if marked_to_fail(index, fail_rate) else OK_MARK


def make_value(index: int, size: int, fail: bool) -> bytes:
    """A value of exactly `size` bytes (at least 1): marker byte, index, padding."""
    return marked_value(index, size, FAIL_MARK if fail else OK_MARK)


def marked_value(index: int, size: int, mark: bytes) -> bytes:
    """A value of exactly `size` bytes (at least 1): `mark`, index, padding."""
    head = mark + b"%d:" % index
    if size <= len(head):
        return head[: max(size, 1)]
    return head + b"x" * (size - len(head))


def produce_input(
    bootstrap: str,
    topic: str,
    records: int,
    partitions: int,
    record_bytes: int,
    failure_rate: float,
    *,
    start_index: int = 0,
) -> dict[str, float]:
    """Produce `records` records round-robin over `partitions`; returns counts and timing."""
    from confluent_kafka import Producer

    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "enable.idempotence": True,
            "linger.ms": 20,
            "batch.num.messages": 10000,
            "queue.buffering.max.messages": 500000,
            "compression.type": "lz4",
        }
    )
    started = time.monotonic()
    failing = 0
    for i in range(start_index, start_index + records):
        fail = marked_to_fail(i, failure_rate)
        failing += fail
        while True:
            try:
                producer.produce(
                    topic,
                    key=b"k%d" % i,
                    value=make_value(i, record_bytes, fail),
                    partition=i % partitions,
                )
                break
            except BufferError:
                producer.poll(0.05)
    remaining = producer.flush(120)
    if remaining:
        raise RuntimeError(f"{remaining} records not delivered to {topic}")
    return {"records": records, "marked": failing, "seconds": time.monotonic() - started}
