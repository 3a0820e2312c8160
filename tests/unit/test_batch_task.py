"""The executor side of a batch, driven with Arrow batches directly (no Spark, no Kafka)."""

from __future__ import annotations

import dataclasses
import gc
import json
import time
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import pytest

from retrylib.batch_task import TaskPlan, run_task
from retrylib.headers import RetryState, decode_retry_state, encode_retry_headers, split_headers
from retrylib.kafka_source import KAFKA_ARROW_SCHEMA
from retrylib.results import result_schema

OUTPUT = pa.schema(
    [("key", pa.string()), ("topic", pa.string()), ("offset", pa.int64()), ("attempt", pa.int32())]
)
TIER = "orders.retry.5s"


@pytest.fixture
def plan(tmp_path: Path) -> TaskPlan:
    return TaskPlan(
        job="job",
        batch_id=4,
        now_ms=int(time.time() * 1000),
        handler="unit_handlers:by_key",
        handler_paths=(str(Path(__file__).parent),),
        timeout_seconds=None,
        output_schema=OUTPUT,
        dead_letter_topic="orders.dlt",
        retry_topics={"orders": (TIER, "orders.retry.1m")},
        tier_delays_ms=(5000, 60000),
        partition_counts={TIER: 3, "orders.retry.1m": 3, "orders.dlt": 3},
        max_attempts=3,
        jitter=0.0,
        non_retryable=("ValueError",),
    )


def kafka_batch(rows: list[dict]) -> pa.RecordBatch:
    now = datetime.now(UTC)
    full = [
        {
            "value": b"v",
            "topic": "orders",
            "partition": 1,
            "timestamp": now,
            "timestampType": 0,
            "headers": [],
            **row,
        }
        for row in rows
    ]
    for row in full:
        row["headers"] = [{"key": k, "value": v} for k, v in row["headers"]]
    return pa.RecordBatch.from_pylist(full, schema=KAFKA_ARROW_SCHEMA)


def route(plan: TaskPlan, rows: list[dict]) -> tuple[dict, dict[str, list[dict]]]:
    batches = list(run_task(plan, iter([kafka_batch(rows)])))
    assert all(batch.schema == result_schema(OUTPUT) for batch in batches)
    results = pa.Table.from_batches(batches).to_pylist()
    [counters] = [json.loads(r["counters"]) for r in results if r["kind"] == "counters"]
    written: dict[str, list[dict]] = {"output": [], "dead_letter": [], "staged": []}
    for row in results:
        if row["kind"] != "counters":
            written[row["kind"]].append(row[row["kind"]])
    return counters, written


def retry_headers(attempt: int, not_before_ms: int, record_id: str = "r1") -> list:
    state = RetryState(record_id, attempt, not_before_ms, "orders", 2, 17, 1000, 1, 2, "E", "m")
    return encode_retry_headers([("trace", b"t1")], state)


def test_success_writes_output_rows(plan):
    counters, written = route(plan, [{"key": b"ok-1", "offset": 5}, {"key": b"none", "offset": 6}])
    assert written["output"] == [{"key": "ok-1", "topic": "orders", "offset": 5, "attempt": 0}]
    assert counters["succeeded"] == 2 and counters["records_main"] == 2


def test_failure_goes_to_first_tier_never_early(plan):
    before = int(time.time() * 1000)
    counters, written = route(plan, [{"key": b"fail-1", "offset": 9, "headers": [("h", b"x")]}])
    [staged] = written["staged"]
    assert (staged["topic"], staged["partition"]) == (TIER, 1)
    user, own = split_headers([(h["key"], h["value"]) for h in staged["headers"]])
    state = decode_retry_state(own)
    assert user == [("h", b"x")]
    assert (state.attempt, state.origin_offset, state.error_class) == (
        1,
        9,
        "builtins.RuntimeError",
    )
    assert state.not_before_ms >= before + 5000
    assert staged["timestamp_ms"] == state.not_before_ms - 5000
    assert counters["retried_tier_0"] == 1


def test_non_retryable_goes_to_dead_letter(plan):
    counters, written = route(plan, [{"key": b"stop-1", "offset": 3}])
    [dead] = written["dead_letter"]
    assert (dead["reason"], dead["attempts"], dead["error_class"]) == (
        "non_retryable",
        1,
        "retrylib.errors.NonRetryable",
    )
    assert [s["topic"] for s in written["staged"]] == ["orders.dlt"]
    assert counters["dead_lettered"] == 1


def test_retry_record_is_handed_over_as_the_original(plan):
    rows = [{"key": b"ok-2", "topic": TIER, "offset": 40, "headers": retry_headers(1, 0)}]
    counters, written = route(plan, rows)
    assert written["output"] == [{"key": "ok-2", "topic": "orders", "offset": 17, "attempt": 1}]
    assert counters["records_retry"] == 1


def test_last_attempt_failure_is_dead_lettered_as_exhausted(plan):
    rows = [{"key": b"fail-2", "topic": TIER, "offset": 41, "headers": retry_headers(2, 0)}]
    _, written = route(plan, rows)
    [dead] = written["dead_letter"]
    assert (dead["reason"], dead["attempts"], dead["origin_offset"]) == (
        "attempts_exhausted",
        3,
        17,
    )
    assert dead["headers"] == [{"key": "trace", "value": b"t1"}]


def test_corrupt_retry_headers_are_dead_lettered(plan):
    rows = [{"key": b"ok-3", "topic": TIER, "offset": 42, "headers": [("retrylib.id", b"x")]}]
    _, written = route(plan, rows)
    [dead] = written["dead_letter"]
    assert (dead["reason"], dead["attempts"], dead["source_topic"]) == (
        "corrupt_retry_headers",
        0,
        TIER,
    )


def test_duplicate_retry_in_one_task_is_skipped(plan):
    rows = [
        {"key": b"ok-4", "topic": TIER, "offset": o, "headers": retry_headers(1, 0)}
        for o in (50, 51)
    ]
    counters, written = route(plan, rows)
    assert len(written["output"]) == 1 and counters["duplicates_skipped"] == 1


def test_retry_not_yet_due_is_requeued_not_handled(plan):
    not_before = plan.now_ms + 60_000
    rows = [{"key": b"ok-5", "topic": TIER, "offset": 60, "headers": retry_headers(1, not_before)}]
    counters, written = route(plan, rows)
    assert written["output"] == [] and counters["requeued_not_due"] == 1
    [staged] = written["staged"]
    assert (staged["topic"], staged["timestamp_ms"]) == (TIER, not_before - 5000)


def test_rows_that_do_not_fit_the_schema_fail_only_their_record(plan):
    rows = [{"key": b"ok-6", "offset": 1}, {"key": b"wrongtype", "offset": 2}]
    counters, written = route(plan, rows)
    assert [r["key"] for r in written["output"]] == ["ok-6"]
    [staged] = written["staged"]
    _, own = split_headers([(h["key"], h["value"]) for h in staged["headers"]])
    assert decode_retry_state(own).error_class.endswith("BadHandlerResult")
    assert counters["succeeded"] == 1 and counters["retried_tier_0"] == 1


def vectorised(plan: TaskPlan, handler: str, kind: str = "arrow") -> TaskPlan:
    return dataclasses.replace(plan, handler=f"unit_handlers:{handler}", handler_kind=kind)


@pytest.mark.parametrize(
    ("handler", "kind"), [("arrow_table", "arrow"), ("pandas_frame", "pandas")]
)
def test_vectorised_frame_result_is_written_whole(plan, handler, kind):
    rows = [{"key": f"ok-{i}".encode(), "offset": i} for i in range(5)]
    counters, written = route(vectorised(plan, handler, kind), rows)
    assert sorted(r["key"] for r in written["output"]) == [f"ok-{i}" for i in range(5)]
    assert counters["succeeded"] == 5 and counters["records_main"] == 5


def test_vectorised_per_row_results_fail_only_their_rows(plan):
    rows = [{"key": b"ok-1", "offset": 1}, {"key": b"fail-2", "offset": 2}]
    counters, written = route(vectorised(plan, "arrow_rows"), rows)
    assert [r["key"] for r in written["output"]] == ["ok-1"]
    assert [s["topic"] for s in written["staged"]] == [TIER]
    assert counters["succeeded"] == 1 and counters["retried_tier_0"] == 1


def test_vectorised_call_that_raises_fails_every_row(plan):
    rows = [{"key": f"ok-{i}".encode(), "offset": i} for i in range(3)]
    counters, written = route(vectorised(plan, "arrow_raises"), rows)
    assert written["output"] == [] and counters["retried_tier_0"] == 3


def test_vectorised_batch_with_retries_passes_the_original(plan):
    rows = [{"key": b"ok-7", "topic": TIER, "offset": 40, "headers": retry_headers(1, 0)}]
    _, written = route(vectorised(plan, "arrow_table"), rows)
    assert written["output"] == [{"key": "ok-7", "topic": "orders", "offset": 17, "attempt": 1}]


def test_vectorised_batch_of_only_duplicate_retries_is_counted_once(plan):
    rows = [
        {"key": b"ok-8", "topic": TIER, "offset": o, "headers": retry_headers(1, 0)}
        for o in (70, 71)
    ]
    counters, written = route(vectorised(plan, "arrow_rows"), rows)
    assert len(written["output"]) == 1
    assert (counters["records_retry"], counters["duplicates_skipped"]) == (2, 1)


def test_vectorised_batch_with_nothing_due_calls_no_handler(plan):
    not_before = plan.now_ms + 60_000
    rows = [{"key": b"ok-9", "topic": TIER, "offset": 80, "headers": retry_headers(1, not_before)}]
    counters, written = route(vectorised(plan, "arrow_raises"), rows)
    assert written["output"] == [] and counters["requeued_not_due"] == 1
    assert counters["records_retry"] == 1 and "retried_tier_0" not in counters


def test_the_collector_thresholds_come_back_after_a_task(plan):
    before = gc.get_threshold()
    route(plan, [{"key": b"ok-1", "offset": 1}])
    assert gc.get_threshold() == before
