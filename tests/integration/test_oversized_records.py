"""Records too large for a retry or dead-letter topic do not wedge the job (issue 11, item 3).

On the real broker: a value just under a retry topic's `max.message.bytes` fails once; its
retry copy, with retrylib's headers, would be over the limit. It goes to the dead-letter
table in full and, cut to fit, to the dead-letter topic; the rest of the batch goes on.
"""

from __future__ import annotations

import base64
import os
import re
import time
import uuid

import pyarrow as pa
import pytest
from confluent_kafka.admin import NewTopic
from helpers import produce, read_table, read_topic, run_until, settled_count

from retrylib.config.topic_names import produced_topic
from retrylib.errors import RecordTooLargeError
from retrylib.kafka.clients import make_admin
from retrylib.kafka.record_size import wire_size
from retrylib.retry import headers as h
from retrylib.sinks.outgoing_records import OUTGOING_SCHEMA
from retrylib.sinks.transactional_producer import UnitProducer

TIER_LIMIT, DEAD_LETTER_LIMIT = 200_000, 100_000
BIG_VALUE = 199_700  # fits the tier alone; with retrylib's retry headers it does not


def create_topics(bootstrap: str, limits: dict[str, int], partitions: int = 2) -> None:
    admin = make_admin(bootstrap, {})
    futures = admin.create_topics(
        [
            NewTopic(topic, partitions, 1, config={"max.message.bytes": str(limit)})
            for topic, limit in limits.items()
        ]
    )
    for future in futures.values():
        future.result(30)


def test_a_retry_copy_over_the_tier_limit_is_dead_lettered_and_the_rest_goes_on(
    spark, bootstrap_servers, make_topic, write_config
):
    topic = make_topic("orders", partitions=2)
    config = write_config([topic], retry={"delays": ["1s"], "max_attempts": 3})
    tier = config.retry.tiers[0].topics[topic]
    create_topics(
        bootstrap_servers, {tier: TIER_LIMIT, config.dead_letter.topic: DEAD_LETTER_LIMIT}
    )
    # Random, so that compression cannot bring the retry copy under the limit.
    big = base64.b64encode(os.urandom(BIG_VALUE)).decode()[:BIG_VALUE]
    small = [(f"ok-{i}", f"v{i}") for i in range(10)] + [(f"flaky1-{i}", "f") for i in range(4)]
    produce(bootstrap_servers, topic, [("flaky1-big", big), *small], partitions=2)

    results = run_until(spark, config, lambda: settled_count(config) >= len(small) + 1, timeout=150)

    output = read_table(config.output.table).to_pylist()
    assert sorted(row["key"] for row in output) == sorted(key for key, _ in small)
    [dead] = read_table(config.dead_letter.table).to_pylist()
    assert (dead["key"], dead["reason"], dead["attempts"]) == (b"flaky1-big", "record_too_large", 1)
    assert dead["value"] == big.encode()  # in full in the table

    [on_topic] = read_topic(bootstrap_servers, config.dead_letter.topic)
    _, own = h.split_headers(on_topic.headers())
    assert own[h.VALUE_TRUNCATED] == str(BIG_VALUE).encode()
    assert own[h.DEAD_LETTER_REASON] == b"record_too_large"
    assert big.encode().startswith(on_topic.value()) and on_topic.value()
    assert wire_size(on_topic.key(), on_topic.value(), on_topic.headers()) <= DEAD_LETTER_LIMIT

    counted = {
        name: sum(r.counters.get(name, 0) for r in results)
        for name in ("dead_lettered_too_large", "dead_letter_truncated", "dead_lettered")
    }
    assert counted == {"dead_lettered_too_large": 1, "dead_letter_truncated": 1, "dead_lettered": 1}


def outgoing(topic: str, value: bytes) -> pa.RecordBatch:
    row = {"topic": topic, "partition": 0, "timestamp_ms": int(time.time() * 1000)}
    row.update({"key": b"k", "value": value, "headers": []})
    return pa.RecordBatch.from_pylist([row], schema=OUTGOING_SCHEMA)


@pytest.mark.parametrize(
    ("limit", "size", "message"),
    [
        # The broker refuses it: the topic's own limit is named.
        (20_000, 30_000, r"broker refused a record of 30\d{3} bytes for TOPIC\[0\].*\(20000\)"),
        # librdkafka refuses it before sending: retrylib's producer limit is named.
        (2_000_000, 1_100_000, r"1100\d{3} bytes for TOPIC\[0\] is over the 1000000 bytes"),
    ],
)
def test_a_record_kafka_refuses_as_too_large_fails_at_once_naming_sizes(
    bootstrap_servers, limit, size, message
):
    job = f"sizes-{uuid.uuid4().hex[:10]}"
    topic = f"{job}-big"
    create_topics(bootstrap_servers, {topic: limit, produced_topic(job): 1_048_588}, partitions=1)
    producer = UnitProducer(
        job,
        f"{job}-app",
        0,
        bootstrap_servers,
        {},
        signing_key=b"k" * 32,
        topic_max_bytes=lambda: {topic: limit},
    )
    value = os.urandom(size)  # compression must not shrink it under the limit
    started = time.monotonic()
    try:
        with pytest.raises(RecordTooLargeError, match=message.replace("TOPIC", re.escape(topic))):
            producer.produce_once(0, lambda: iter([outgoing(topic, value)]), 0)
    finally:
        producer.close()
    assert time.monotonic() - started < 30  # not retried for PRODUCE_RETRY_SECONDS (90 s)
