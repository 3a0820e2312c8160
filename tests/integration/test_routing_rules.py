"""Spring Kafka's routing rules and zkafka's skip: a dead-letter topic per exception class,
a total retry timeout, and records a handler drops on purpose."""

from __future__ import annotations

import time

from helpers import produce, read_table, read_topic, run_until, settled_count


def test_routes_timeout_and_skip(spark, bootstrap_servers, make_topic, write_config):
    topic = make_topic("orders", partitions=1)
    invalid = f"{topic}.invalid.dlt"
    config = write_config(
        [topic],
        # "always" fails every 2 s or so until a failure comes 3 s or more after the first.
        retry={"delays": ["2s"], "max_attempts": 10, "timeout": "3s"},
        dead_letter={"routes": {"ValueError": invalid}},
    )
    keys = ["ok-1", "bad-1", "always-1", "skip-1", "skip-2", "ok-2"]
    produce(bootstrap_servers, topic, [(k, "v") for k in keys])
    started = time.monotonic()

    results = run_until(spark, config, lambda: settled_count(config) >= 4)
    elapsed = time.monotonic() - started

    assert sorted(r["key"] for r in read_table(config.output.table).to_pylist()) == ["ok-1", "ok-2"]
    dead = {r["key"].decode(): r for r in read_table(config.dead_letter.table).to_pylist()}
    assert (dead["bad-1"]["reason"], dead["bad-1"]["attempts"]) == ("non_retryable", 1)
    timed_out = dead["always-1"]
    assert timed_out["reason"] == "retry_timeout" and 2 <= timed_out["attempts"] < 10
    assert (timed_out["last_failure"] - timed_out["first_failure"]).total_seconds() >= 3
    assert elapsed >= 3
    assert [m.key() for m in read_topic(bootstrap_servers, invalid)] == [b"bad-1"]
    assert [m.key() for m in read_topic(bootstrap_servers, config.dead_letter.topic)] == [
        b"always-1"
    ]
    assert sum(r.counters.get("skipped_by_handler", 0) for r in results) == 2
