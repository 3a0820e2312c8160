"""Records the job did not write, on its topics: they never shadow, stall or crash the job."""

from __future__ import annotations

import time

import pytest
from helpers import produce, read_table, run_until, settled_count

from retrylib.errors import RedriveError
from retrylib.job.start import prepare_topics
from retrylib.kafka.clients import make_producer
from retrylib.ops.redrive import Selection, redrive
from retrylib.retry.headers import RetryState, encode_retry_headers, record_id

TEN_YEARS_MS = 10 * 365 * 24 * 3600 * 1000


def forged_retry(config, main_topic: str, *, offset: int, not_before_ms: int) -> list:
    """Retry headers as an outsider can write them: right job, id and attempt, no signature."""
    state = RetryState(
        job=config.job.name,
        id=record_id(config.job.name, main_topic, 0, offset),
        attempt=1,
        not_before_ms=not_before_ms,
        origin_topic=main_topic,
        origin_partition=0,
        origin_offset=offset,
        origin_timestamp_ms=0,
        first_failure_ms=0,
        last_failure_ms=0,
        error_class="x",
        error_message="forged",
    )
    return encode_retry_headers([], state)


def produce_to_tier(bootstrap: str, tier: str, key: bytes, headers: list, timestamp_ms: int):
    producer = make_producer(bootstrap, {})
    producer.produce(
        tier, key=key, value=b"forged", headers=headers, partition=0, timestamp=timestamp_ms
    )
    producer.flush(30)


def outcomes(config) -> tuple[dict[str, dict], dict[str, dict]]:
    output = {row["key"]: row for row in read_table(config.output.table).to_pylist()}
    dead = {row["key"].decode(): row for row in read_table(config.dead_letter.table).to_pylist()}
    return output, dead


def test_a_forged_retry_does_not_make_the_genuine_record_vanish(
    spark, bootstrap_servers, make_topic, write_config
):
    topic = make_topic("orders", partitions=1)
    config = write_config([topic], retry={"delays": ["2s"], "max_attempts": 3})
    prepare_topics(config)
    [tier] = config.retry.tier_topics()
    now = int(time.time() * 1000)
    # The id the next main record (offset 0) gets on its first failure; due in 1 s.
    headers = forged_retry(config, topic, offset=0, not_before_ms=now + 1000)
    produce_to_tier(bootstrap_servers, tier, b"ok-forged", headers, now - 1000)
    # And one that would hold the tier partition for ten years if it were re-queued.
    far = forged_retry(config, topic, offset=1, not_before_ms=now + TEN_YEARS_MS)
    produce_to_tier(bootstrap_servers, tier, b"ok-far", far, now - 2000)
    produce(bootstrap_servers, topic, [("flaky1-genuine", "v"), ("flaky1-behind", "v")])

    results = run_until(spark, config, lambda: settled_count(config) >= 4)

    output, dead = outcomes(config)
    assert sorted(output) == ["flaky1-behind", "flaky1-genuine"]
    assert output["flaky1-genuine"]["attempt"] == 1
    assert sorted(dead) == ["ok-far", "ok-forged"]
    assert {row["reason"] for row in dead.values()} == {"unverified_retry_record"}
    assert all(row["origin_topic"] == tier for row in dead.values())
    assert not any(r.counters.get("duplicates_skipped") for r in results)
    # Sent back to the tier they came from they would be dead-lettered again: refused.
    with pytest.raises(RedriveError, match="is a retry tier of job"):
        redrive(config, Selection(), spark=spark)
    assert read_table(config.dead_letter.table).column("redrive_id").null_count == 2


def test_main_records_lose_reserved_headers_only(
    spark, bootstrap_servers, make_topic, write_config
):
    topic = make_topic("orders", partitions=1)
    config = write_config([topic], retry={"delays": ["1s"], "max_attempts": 3})
    headers = [
        ("retrylib.x", b"mine"),
        ("retrylib.id", b"forged"),
        ("dup", b"a"),
        ("retrylib.attempt", b"7"),
        ("dup", None),
        ("bin", b"\xff\x00"),
    ]
    producer = make_producer(bootstrap_servers, {})
    producer.produce(topic, key=b"always-1", value=b"v", headers=headers)
    producer.flush(30)

    results = run_until(spark, config, lambda: settled_count(config) >= 1)

    _, dead = outcomes(config)
    row = dead["always-1"]
    assert (row["attempts"], row["reason"]) == (3, "attempts_exhausted")
    kept = [(h["key"], h["value"]) for h in row["headers"]]
    assert kept == [("retrylib.x", b"mine"), ("dup", b"a"), ("dup", None), ("bin", b"\xff\x00")]
    assert sum(r.counters.get("reserved_headers_removed", 0) for r in results) == 2


def test_retry_after_beyond_the_maximum_is_dead_lettered_and_a_long_one_holds_nothing_up(
    spark, bootstrap_servers, make_topic, write_config
):
    topic = make_topic("orders", partitions=1)
    config = write_config(
        [topic], retry={"delays": ["1s"], "max_attempts": 3, "max_retry_after": "1m"}
    )
    started = time.monotonic()
    produce(
        bootstrap_servers,
        topic,
        [("afterhuge-1", "v"), ("afterlong-1", "v"), ("flaky1-1", "v"), ("flaky1-2", "v")],
    )
    done_at: dict[str, float] = {}

    def settled() -> bool:
        # One read of each table: the times and the answer come from the same rows.
        output, dead = outcomes(config)
        read_at = time.monotonic() - started
        for key in output:
            done_at.setdefault(key, read_at)
        return len(output) + len(dead) >= 4

    results = run_until(spark, config, settled)

    output, dead = outcomes(config)
    assert sorted(output) == ["afterlong-1", "flaky1-1", "flaky1-2"]
    assert (dead["afterhuge-1"]["reason"], dead["afterhuge-1"]["attempts"]) == (
        "retry_after_too_long",
        1,
    )
    # A 15 s wait on a 1 s tier goes round the tier in hops, never early, and the records
    # that failed after it on the same tier partition do not wait for it. (15 s: with 6 s, the
    # tier's first batch on a loaded machine came 7 s after the failures, all three due.)
    assert done_at["afterlong-1"] >= 15
    assert max(done_at["flaky1-1"], done_at["flaky1-2"]) < done_at["afterlong-1"]
    assert sum(r.counters.get("requeued_not_due", 0) for r in results) >= 1


def test_jobs_on_one_topic_keep_their_retries_apart(
    spark, bootstrap_servers, make_topic, write_config, tmp_path
):
    topic = make_topic("orders", partitions=2)
    keys = [f"flaky1-{i}" for i in range(20)]
    produce(bootstrap_servers, topic, [(k, "v") for k in keys])

    def job(name: str, retry: str):
        return write_config(
            [topic],
            name=name,
            retry=retry,
            output={"table": f"{tmp_path}/{name}/out"},
            dead_letter={"table": f"{tmp_path}/{name}/dlq"},
            job={"checkpoint": f"{tmp_path}/{name}/checkpoint"},
        )

    own_tiers = {"delays": ["1s"], "max_attempts": 3}
    first, second = job("first", own_tiers), job("second", own_tiers)
    assert set(first.retry.tier_topics()).isdisjoint(second.retry.tier_topics())
    shared = {**own_tiers, "topic_template": "{topic}.shared.retry.{delay}"}
    third, fourth = job("third", shared), job("fourth", shared)

    skipped = {}
    for config in (first, second, third, fourth):
        results = run_until(spark, config, lambda c=config: settled_count(c) >= len(keys))
        output, dead = outcomes(config)
        assert sorted(output) == sorted(keys) and not dead, config.job.name
        assert read_table(config.output.table).num_rows == len(keys)
        skipped[config.job.name] = sum(r.counters.get("skipped_other_job", 0) for r in results)
    # "fourth" shares its tier with "third", whose 20 retries are still in it.
    assert skipped == {"first": 0, "second": 0, "third": 0, "fourth": len(keys)}


def test_the_broker_refuses_a_tier_record_that_would_hold_the_tier_up(
    bootstrap_servers, make_topic, write_config
):
    topic = make_topic("orders", partitions=1)
    config = write_config([topic], retry={"delays": ["2s"], "max_attempts": 3})
    prepare_topics(config)
    [tier] = config.retry.tier_topics()
    errors: dict[bytes, object] = {}
    producer = make_producer(bootstrap_servers, {})
    now = int(time.time() * 1000)
    # Half an hour ahead: within the broker's own default limit, past the tier's.
    for key, timestamp in ((b"far", now + 1_800_000), (b"near", now + 2000 + 60_000)):
        producer.produce(
            tier,
            key=key,
            value=b"x",
            partition=0,
            timestamp=timestamp,
            on_delivery=lambda error, message: errors.setdefault(message.key(), error),
        )
        producer.flush(30)  # one record per request: the broker refuses a request whole
    assert errors[b"near"] is None
    assert errors[b"far"] is not None and errors[b"far"].name() == "INVALID_TIMESTAMP"
