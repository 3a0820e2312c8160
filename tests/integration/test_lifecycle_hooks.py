"""Lifecycle hooks through `retrylib run` as a user runs it: record hooks on the executors,
batch hooks on the driver, and hooks that fail or hang without changing what the job does;
and handler calls as spans of the records' traces in a worker that traces."""

from __future__ import annotations

import json
import signal
import uuid
from pathlib import Path

from chispa import assert_df_equality
from helpers import (
    job_env,
    metrics_totals,
    produce,
    retrylib_command,
    run_job_available_now,
    running_job,
    wait_for,
    write_job_toml,
)

from retrylib.kafka.clients import make_producer

HANDLERS_DIR = Path(__file__).parent / "handlers"
OUTPUT_SCHEMA = "key STRING, value STRING, topic STRING, partition INT, offset BIGINT, attempt INT"
RECORDS = [("ok-0", "a"), ("ok-1", "b"), ("flaky1-0", "c"), ("bad-0", "d")]
HOOKS = {
    "before_record": "lifecycle_hooks:before",
    "after_record": "lifecycle_hooks:after",
    "on_retry": "lifecycle_hooks:retried",
    "on_dead_letter": "lifecycle_hooks:dead",
    "on_batch_start": "lifecycle_hooks:batch_start",
    "on_batch_end": "lifecycle_hooks:batch_end",
}


def job_config(
    tmp_path: Path, bootstrap: str, topic: str, name: str, **sections: dict[str, object]
) -> Path:
    """tmp_path/job.toml: job `name` reading `topic` with a handler from handlers/ (its
    `function` in `sections["handler"]`); `sections` as in `helpers.job_toml`."""
    handler = {"output_schema": OUTPUT_SCHEMA, "paths": [HANDLERS_DIR], **sections.pop("handler")}
    return write_job_toml(
        tmp_path / "job.toml",
        topics=[topic],
        name=name,
        bootstrap_servers=bootstrap,
        handler=handler,
        **sections,
    )


def run_hooked_job(
    tmp_path: Path, bootstrap: str, topic: str, hooks: dict[str, str], **handler: object
):
    """`retrylib run --available-now` of a job with `hooks` (and more `handler` keys); its
    hook log's path and result."""
    path = job_config(
        tmp_path,
        bootstrap,
        topic,
        "hooked",
        handler={"function": "job_handlers:by_key", **handler},
        retry={"delays": ["1m"], "max_attempts": 3, "non_retryable": ["ValueError"]},
        hooks=hooks,
    )
    hook_log = tmp_path / "hooks.jsonl"
    done = run_job_available_now(path, env={"RETRYLIB_TEST_HOOK_LOG": str(hook_log)})
    assert done.returncode == 0, done.stderr[-3000:]
    return hook_log, done


def assert_outcomes(spark, tmp_path: Path) -> None:
    """ok-* in the output table, bad-0 dead-lettered, flaky1-0 waiting in its retry tier."""
    output = spark.read.format("delta").load(str(tmp_path / "out")).select("key")
    assert_df_equality(
        output, spark.createDataFrame([("ok-0",), ("ok-1",)], output.schema), ignore_row_order=True
    )
    dead = spark.read.format("delta").load(str(tmp_path / "out_dead_letter"))
    assert [row["reason"] for row in dead.collect()] == ["non_retryable"]


def test_hooks_are_told_of_every_record_and_batch(spark, bootstrap_servers, make_topic, tmp_path):
    topic = make_topic("hooked", partitions=2)
    produce(bootstrap_servers, topic, RECORDS, partitions=2)

    hook_log, done = run_hooked_job(tmp_path, bootstrap_servers, topic, HOOKS)

    events = [json.loads(line) for line in hook_log.read_text().splitlines()]
    by_event: dict[str, list[dict]] = {}
    for event in events:
        by_event.setdefault(event.pop("event"), []).append(event)
    keys = sorted(key for key, _ in RECORDS)
    assert sorted(e["key"] for e in by_event["before"]) == keys
    assert sorted((e["key"], e["error"]) for e in by_event["after"]) == [
        ("bad-0", "ValueError"),
        ("flaky1-0", "TransientError"),
        ("ok-0", None),
        ("ok-1", None),
    ]
    assert by_event["retry"] == [{"key": "flaky1-0", "tier": 1}]
    assert by_event["dead"] == [{"key": "bad-0", "reason": "non_retryable"}]
    started = [e["batch_id"] for e in by_event["batch_start"]]
    assert started == [e["batch_id"] for e in by_event["batch_end"]]
    totals = sum((e["counters"].get("records_main", 0) for e in by_event["batch_end"]), 0)
    assert totals == len(RECORDS)
    assert_outcomes(spark, tmp_path)


def test_hooks_that_fail_or_hang_change_nothing_and_are_counted(
    spark, bootstrap_servers, make_topic, tmp_path
):
    topic = make_topic("broken-hooks", partitions=2)
    produce(bootstrap_servers, topic, RECORDS, partitions=2)
    hooks = {
        **dict.fromkeys(HOOKS, "lifecycle_hooks:broken"),
        "before_record": "lifecycle_hooks:hangs",  # stopped at handler.timeout
        "on_batch_end": "lifecycle_hooks:hangs",  # left running at hooks.timeout
        "timeout": "1s",
    }

    _, done = run_hooked_job(tmp_path, bootstrap_servers, topic, hooks, timeout="1s")

    assert_outcomes(spark, tmp_path)
    metrics = [
        json.loads(line.split("retrylib.metrics: ", 1)[1])
        for line in done.stderr.splitlines()
        if "retrylib.metrics: " in line
    ]
    # Per record: before and after; flaky1-0's retry; bad-0's dead letter; two per batch.
    assert sum(m["hook_errors"] for m in metrics) == 4 * 2 + 1 + 1 + 2 * len(metrics)
    assert "hook on_batch_start (lifecycle_hooks:broken) raised RuntimeError" in done.stderr
    assert (
        "hook before_record (lifecycle_hooks:hangs) raised HandlerTimeout: hook before_record "
        "did not return within 1s" in done.stderr
    )
    assert (
        "hook on_batch_end (lifecycle_hooks:hangs) has not returned within hooks.timeout (1s)"
        in done.stderr
    )


def test_each_attempt_of_a_traced_record_is_a_span_of_its_trace(
    spark, bootstrap_servers, make_topic, tmp_path
):
    """A handler module that sets a tracer provider: `retrylib run` calls the handler in a
    span per attempt, each a child of the record's `traceparent`, which the dead letter
    keeps."""
    topic = make_topic("traced", partitions=1)
    trace_id, parent_id = uuid.uuid4().hex, uuid.uuid4().hex[:16]
    traceparent = f"00-{trace_id}-{parent_id}-01".encode()
    producer = make_producer(bootstrap_servers, {})
    producer.produce(topic, key=b"always-0", value=b"v", headers=[("traceparent", traceparent)])
    producer.produce(topic, key=b"ok-0", value=b"v")
    producer.flush(30)
    path = job_config(
        tmp_path,
        bootstrap_servers,
        topic,
        "traced",
        handler={"function": "traced_handlers:by_key"},
        job={"trigger": "500ms"},
        retry={"delays": ["1s", "2s"], "max_attempts": 3},
    )
    spans = tmp_path / "spans.jsonl"
    log = tmp_path / "job.log"
    command = retrylib_command("run", str(path), "--master", "local[2]")
    with running_job(command, job_env({"RETRYLIB_TEST_SPAN_LOG": str(spans)}), log) as job:
        wait_for(
            lambda: metrics_totals(log.read_text()).get("dead_lettered") == 1,
            180,
            "a dead letter",
            job,
        )
        job.send_signal(signal.SIGTERM)
        assert job.wait(60) == 0, log.read_text()[-3000:]

    by_key = {}
    for line in spans.read_text().splitlines():
        span = json.loads(line)
        by_key.setdefault(span["attributes"]["messaging.kafka.offset"], []).append(span)
    traced, plain = by_key[0], by_key[1]
    assert [
        (s["attributes"]["retrylib.attempt"], s["attributes"]["retrylib.outcome"]) for s in traced
    ] == [
        (0, "failed"),
        (1, "failed"),
        (2, "failed"),
    ]
    assert {(s["trace_id"], s["parent_id"]) for s in traced} == {(trace_id, parent_id)}
    assert [(s["attributes"]["retrylib.outcome"], s["parent_id"]) for s in plain] == [
        ("handled", None)
    ]
    dead = spark.read.format("delta").load(str(tmp_path / "out_dead_letter")).collect()
    assert [(h["key"], h["value"]) for h in dead[0]["headers"]] == [("traceparent", traceparent)]
