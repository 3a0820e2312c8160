"""Records at the edges of what Kafka allows travel byte-exact through a retry, and handler
failures of any shape are recorded, never fatal."""

from __future__ import annotations

from helpers import read_table, run_until, settled_count

from retrylib.kafka.clients import make_producer
from retrylib.retry.headers import MAX_ERROR_MESSAGE_BYTES

THOUSAND = [(f"h{i}", i.to_bytes(2, "big")) for i in range(1000)]
RECORDS = [
    (None, None, [("do", b"fail-once")]),
    (b"", b"", [("do", b"fail-once"), ("", b""), ("n", None)]),
    (b"\xff\xfe", b"\x00\xff", [("bin", b"\xff"), ("do", b"fail-once")]),
    (b"k4", b"v", [("do", b"fail-once"), ("dup", b"1"), ("dup", b"2"), *THOUSAND, ("dup", b"3")]),
]


def test_edge_records_keep_every_byte_through_a_retry(
    spark, bootstrap_servers, make_topic, write_config
):
    topic = make_topic("edges", partitions=1)
    config = write_config(
        [topic], handler="edge_handlers:handle", retry={"delays": ["1s"], "max_attempts": 2}
    )
    producer = make_producer(bootstrap_servers, {})
    for key, value, headers in RECORDS:
        producer.produce(topic, key=key, value=value, headers=headers)
    for action in (b"many", b"unprintable", b"huge"):
        producer.produce(topic, key=action, value=b"v", headers=[("do", action)])
    producer.flush(30)

    run_until(spark, config, lambda: settled_count(config) >= 100_000 + len(RECORDS) + 2)

    output = read_table(config.output.table)
    assert output.num_rows == 100_000 + len(RECORDS)
    retried = {row["key"]: row for row in output.to_pylist() if row["attempt"] == 1}
    assert retried == {
        repr(key): {
            "key": repr(key),
            "value": repr((value, headers)),
            "topic": topic,
            "partition": 0,
            "offset": offset,
            "attempt": 1,
        }
        for offset, (key, value, headers) in enumerate(RECORDS)
    }
    dead = {row["key"]: row for row in read_table(config.dead_letter.table).to_pylist()}
    assert sorted(dead) == [b"huge", b"unprintable"]
    assert dead[b"unprintable"]["error_message"] == "<unprintable Unprintable>"
    message = dead[b"huge"]["error_message"]
    assert len(message.encode()) <= MAX_ERROR_MESSAGE_BYTES and message.endswith("bytes]")
    assert all(row["attempts"] == 2 for row in dead.values())
