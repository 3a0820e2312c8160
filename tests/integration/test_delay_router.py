"""Delay-router mode through `retrylib run` as a user runs it: records produced as
Kafka-Retry-Router's README shows (a value, `final_topic` and `msg_ts` headers) are forwarded
byte for byte once their delay has passed, exactly once across runs and a crash; records
with no destination go to the fallback topic, or are logged and counted."""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path

from confluent_kafka import Message
from faults.crash.crash_points import crash_env
from helpers import (
    java_partition,
    logged_metrics,
    metrics_totals,
    read_topic,
    run_cli,
    run_job_available_now,
    run_retrylib,
)

from retrylib.kafka.clients import make_producer

DELAY_MS = 2_000
Headers = list[tuple[str, bytes | None]]


def krr_produce(
    bootstrap: str, topic: str, records: list[tuple[bytes | None, bytes | None, Headers]]
):
    """Produce (key, value, headers) as a Kafka-Retry-Router sender does."""
    producer = make_producer(bootstrap, {})
    for key, value, headers in records:
        producer.produce(topic, key=key, value=value, headers=headers)
    assert producer.flush(30) == 0


def krr_headers(final_topic: str | None, sent_s: int | None) -> Headers:
    headers: Headers = []
    if sent_s is not None:
        headers.append(("msg_ts", str(sent_s).encode()))
    if final_topic is not None:
        headers.append(("final_topic", final_topic.encode()))
    return headers


def write_router(tmp_path: Path, bootstrap: str, delay_topic: str, fallback: str | None) -> Path:
    fallback_line = "" if fallback is None else f'fallback_topic = "{fallback}"\n'
    path = tmp_path / "router.toml"
    path.write_text(
        f'[job]\nname = "krr-{tmp_path.name[-12:]}"\ncheckpoint = "{tmp_path}/checkpoint"\n'
        f'trigger = "500ms"\n\n[kafka]\nbootstrap_servers = "{bootstrap}"\n\n'
        f'[delay_router]\ntopics = {{ "{delay_topic}" = "{DELAY_MS}ms" }}\n{fallback_line}'
    )
    return path


def run_router(path: Path, *, crash_at: str | None = None) -> subprocess.CompletedProcess[str]:
    env = crash_env(crash_at) if crash_at else None
    return run_job_available_now(path, env=env, new_session=True)


def metrics(done: subprocess.CompletedProcess[str]) -> dict[str, int]:
    """The run's counters, summed over its batches' metrics lines."""
    return metrics_totals(done.stderr)


def wait_until_due(sent_s: int) -> None:
    time.sleep(max(0.0, sent_s + DELAY_MS / 1000 + 1 - time.time()))


def as_sent(message: Message) -> tuple:
    return message.key(), message.value(), message.headers() or []


def test_records_are_forwarded_byte_exact_once_due_and_exactly_once(
    bootstrap_servers, make_topic, tmp_path
):
    delay_topic = make_topic("retry_topic_2s", partitions=2)
    orders = make_topic("orders", partitions=3)
    payments = make_topic("payments", partitions=1)
    fallback = f"{delay_topic}.fallback"
    sent = int(time.time())
    to_orders = [
        (
            f"k{i % 5}".encode(),
            f'{{"order": {i}}}'.encode(),
            [("trace", bytes([0, 255, i])), ("empty", None), *krr_headers(orders, sent)],
        )
        for i in range(20)
    ]
    to_payments = [
        (None, b"no key", krr_headers(payments, sent)),
        (b"tombstone", None, krr_headers(payments, sent)),
        (b"unstamped", b"no msg_ts", krr_headers(payments, None)),
    ]
    control = f"_retrylib.krr-{tmp_path.name[-12:]}.produced"  # the job's own control topic
    nowhere = [
        (b"lost-1", b"unknown target", krr_headers("no-such-topic", sent)),
        (b"lost-2", b"no target", krr_headers(None, sent)),
        (b"lost-3", b"1000000", krr_headers(control, sent)),  # a would-be marker
        (b"never", b"year 33658", krr_headers(orders, 999_999_999_999)),  # never due
        (b"loop", b"to itself", krr_headers(delay_topic, sent)),  # would come back for ever
    ]
    # First in each partition, stamped by its producer ten minutes ahead of the clocks here:
    # Kafka's time index would hide every record behind it until then.
    stamped_ahead = [(f"ahead-{p}".encode(), b"v", krr_headers(payments, sent)) for p in (0, 1)]
    producer = make_producer(bootstrap_servers, {})
    for partition, (key, value, headers) in enumerate(stamped_ahead):
        producer.produce(
            delay_topic,
            key=key,
            value=value,
            headers=headers,
            partition=partition,
            timestamp=int(time.time() * 1000) + 600_000,
        )
    assert producer.flush(30) == 0
    krr_produce(bootstrap_servers, delay_topic, to_orders + to_payments + nowhere)
    # Stamped by Kafka now, but sent "later": it waits out its delay from then.
    late_s = int(time.time()) + 45
    late = (b"late", b"sent later", krr_headers(orders, late_s))
    krr_produce(bootstrap_servers, delay_topic, [late])
    path = write_router(tmp_path, bootstrap_servers, delay_topic, fallback)
    wait_until_due(sent)

    first = run_router(path)

    assert first.returncode == 0, first.stderr[-3000:]
    counts = metrics(first)
    assert counts["records_delayed"] == 31
    assert counts["forwarded"] == 25
    assert counts["forwarded_to_fallback"] == 5
    assert counts["requeued_not_due"] == 1
    assert counts["timestamp_header_missing"] == 1
    assert counts["unroutable"] == 0
    forwarded = read_topic(bootstrap_servers, orders)
    assert sorted(map(as_sent, forwarded)) == sorted(to_orders)
    for message in forwarded:
        assert message.partition() == java_partition(message.key(), 3)
        assert message.timestamp()[1] >= sent * 1000 + DELAY_MS  # never early
    assert sorted(map(as_sent, read_topic(bootstrap_servers, payments)), key=repr) == sorted(
        to_payments + stamped_ahead, key=repr
    )
    for partition in (0, 1):
        assert f"{delay_topic}[{partition}]: the record at offset 0 has a Kafka timestamp " in (
            first.stderr
        )
    set_aside = {m.key(): m for m in read_topic(bootstrap_servers, fallback)}
    assert set(set_aside) == {b"lost-1", b"lost-2", b"lost-3", b"never", b"loop"}
    assert set_aside[b"never"].headers()[-2] == (
        "retrylib.dead_letter.reason",
        b"timestamp_too_far_ahead",
    )
    assert set_aside[b"lost-3"].headers()[-2] == (
        "retrylib.dead_letter.reason",
        b"control_final_topic",
    )
    assert set_aside[b"lost-1"].headers()[-2:] == [
        ("retrylib.dead_letter.reason", b"unknown_final_topic"),
        ("retrylib.error.message", b'final_topic "no-such-topic" is not a topic of the cluster'),
    ]
    assert set_aside[b"lost-2"].headers()[-2] == ("retrylib.dead_letter.reason", b"no_final_topic")
    assert set_aside[b"lost-2"].value() == b"no target"
    assert set_aside[b"loop"].headers()[-2] == ("retrylib.dead_letter.reason", b"delay_final_topic")

    wait_until_due(late_s)
    second = run_router(path)

    assert second.returncode == 0, second.stderr[-3000:]
    assert metrics(second)["forwarded"] == 1
    forwarded = read_topic(bootstrap_servers, orders)
    assert sorted(map(as_sent, forwarded)) == sorted([*to_orders, late])
    [held] = [m for m in forwarded if m.key() == b"late"]
    assert held.timestamp()[1] >= late_s * 1000 + DELAY_MS
    assert len(read_topic(bootstrap_servers, fallback)) == 5


def test_with_no_fallback_a_record_with_no_destination_is_logged_and_counted(
    bootstrap_servers, make_topic, tmp_path, capsys
):
    delay_topic = make_topic("retry_topic_2s", partitions=1)
    target = make_topic("target", partitions=1)
    sent = int(time.time())
    krr_produce(
        bootstrap_servers,
        delay_topic,
        [
            (b"ok", b"v", krr_headers(target, sent)),
            (b"lost", b"v", krr_headers("missing-topic", sent)),
        ],
    )
    path = write_router(tmp_path, bootstrap_servers, delay_topic, fallback=None)
    wait_until_due(sent)

    done = run_router(path)

    assert done.returncode == 0, done.stderr[-3000:]
    assert (metrics(done)["forwarded"], metrics(done)["unroutable"]) == (1, 1)
    lag = logged_metrics(done.stderr)[-1]["input_lag"]
    assert lag == {delay_topic: {"lag": 0, "not_due": 0}}
    [line] = [line for line in done.stderr.splitlines() if "not forwarded" in line]
    assert " ERROR " in line
    assert f'{delay_topic}[0]@1 not forwarded: final_topic "missing-topic" is not a topic' in line
    assert [m.key() for m in read_topic(bootstrap_servers, target)] == [b"ok"]

    checked = run_retrylib("check", str(path))
    assert checked.returncode == 0, checked.stderr
    assert (
        f"delay router: records of {delay_topic} (2s) go to the topic in their " in checked.stdout
    )
    assert "logged at ERROR and counted (no fallback_topic)" in checked.stdout
    assert f"ok: delay topic '{delay_topic}' (2s): 1 partitions" in checked.stdout
    producer = make_producer(bootstrap_servers, {})
    ahead = int(time.time() * 1000) + 600_000
    producer.produce(delay_topic, value=b"v", headers=krr_headers(target, sent), timestamp=ahead)
    assert producer.flush(30) == 0
    code, out, err = run_cli(capsys, "status", str(path), "--json")
    assert code == 0, err
    found = json.loads(out)
    assert (found["main_topics"], found["retry_tiers"], found["dead_letters"]) == ([], [], None)
    [delayed] = found["delay_topics"]
    assert (delayed["topics"], delayed["waiting"], delayed["stamped_ahead"]) == (
        [delay_topic],
        1,
        1,
    )
    assert re.fullmatch(
        rf"{delay_topic}\[0\]@2, (10m|9m[0-9]+s) ahead", delayed["first_stamped_ahead"]
    )
    assert [b["forwarded"] for b in found["last_batches"]["batches"]] == [1]
    _, text, _ = run_cli(capsys, "status", str(path))
    assert "delay topics" in text and "forwarded" in text, text
    assert f"warning: {delay_topic}: 1 record(s) with a Kafka timestamp ahead" in text
    redriven = run_retrylib("redrive", str(path))
    assert redriven.returncode != 0
    assert "is a delay router: it has no dead-letter table" in redriven.stderr


def test_a_crash_inside_the_transaction_forwards_each_record_once(
    bootstrap_servers, make_topic, tmp_path
):
    delay_topic = make_topic("retry_topic_2s", partitions=2)
    target = make_topic("target", partitions=2)
    sent = int(time.time())
    records = [(f"r{i}".encode(), b"v", krr_headers(target, sent)) for i in range(30)]
    krr_produce(bootstrap_servers, delay_topic, records)
    path = write_router(tmp_path, bootstrap_servers, delay_topic, fallback=None)
    wait_until_due(sent)

    crashed = run_router(path, crash_at="in_produce")
    assert crashed.returncode == -9, crashed.stderr[-3000:]
    assert read_topic(bootstrap_servers, target) == []
    done = run_router(path)

    assert done.returncode == 0, done.stderr[-3000:]
    assert sorted(map(as_sent, read_topic(bootstrap_servers, target))) == sorted(records)
