"""Retry lateness: how long after its not-before time a retried record is handled.

The job runs on its processing-time trigger with one delay tier and the `late_stamp`
handler: a marked record fails on its first delivery and succeeds on the retry, and every
output row carries the wall-clock time the handler ran (`handled_at_ms`). The retry topic
holds, for each retried record, the `retrylib.not_before` header retrylib wrote (the time
before which it must not be handled) and the record's origin partition and offset. So

    lateness = handled_at_ms (output row, attempt 1) - not_before (retry record header)

measured on the job's own clocks, with nothing estimated. A negative value would mean a
record was handled early.
"""

from __future__ import annotations

from retrylib.kafka.clients import topic_partitions
from retrylib.kafka.reading import ReadToEnd, reading_consumer
from retrylib.retry.headers import NOT_BEFORE, ORIGIN_OFFSET, ORIGIN_PARTITION


def committed_messages(bootstrap: str, topic: str, timeout: float = 30.0) -> list:
    """Every committed record of every partition of `topic` (read_committed, to its end)."""
    consumer = reading_consumer(bootstrap, {}, "bench-lateness")
    try:
        partitions = topic_partitions(consumer, [topic], timeout=10)[topic]
        read = ReadToEnd.from_earliest(consumer, [(topic, p) for p in partitions])
        return list(read.messages(timeout))
    finally:
        consumer.close()


def not_before_by_origin(bootstrap: str, topic: str, timeout: float = 30.0) -> dict:
    """{(origin partition, origin offset): not_before ms} over the committed records of
    every partition of `topic`."""
    found: dict[tuple[int, int], int] = {}
    for message in committed_messages(bootstrap, topic, timeout):
        headers = dict(message.headers() or ())
        key = (int(headers[ORIGIN_PARTITION]), int(headers[ORIGIN_OFFSET]))
        found[key] = int(headers[NOT_BEFORE])
    return found


def handled_by_origin(table_uri: str) -> dict:
    """{(partition, offset): handled_at_ms} of the output rows of retried records."""
    from deltalake import DeltaTable

    rows = DeltaTable(table_uri).to_pyarrow_table(filters=[("attempt", ">=", 1)]).to_pylist()
    return {(r["partition"], r["offset"]): r["handled_at_ms"] for r in rows}
