"""A dead letter's table row: every column of the dead-letter table but the redrive ones."""

from __future__ import annotations

from datetime import UTC, datetime

import pyarrow as pa

from retrylib.sinks.dead_letter import DEAD_LETTER_SCHEMA, DeadLetter

DEAD = DeadLetter(
    id="job:orders:0:7",
    origin_topic="orders",
    origin_partition=0,
    origin_offset=7,
    origin_timestamp_ms=1_700_000_000_000,
    source_topic="orders.retry.5s",
    attempts=3,
    reason="attempts_exhausted",
    error_class="ValueError",
    error_message="bad total",
    stack_trace="Traceback ...",
    first_failure_ms=1_700_000_001_000,
    last_failure_ms=1_700_000_002_000,
    key=b"k",
    value=b"v",
    headers=[("trace", b"1"), ("empty", None)],
)


def test_a_dead_letter_row_fills_every_column_but_the_redrive_ones():
    row = DEAD.row("job", 4, 1_700_000_003_000)

    assert set(row) == set(DEAD_LETTER_SCHEMA.names) - {
        "redrive_id",
        "redrive_topic",
        "redriven_at",
    }


def test_a_dead_letter_row_holds_times_as_utc_timestamps_and_headers_as_pairs():
    [row] = pa.Table.from_pylist(
        [DEAD.row("job", 4, 1_700_000_003_000)], schema=DEAD_LETTER_SCHEMA
    ).to_pylist()

    assert row["origin_timestamp"] == datetime.fromtimestamp(1_700_000_000, UTC)
    assert row["first_failure"] == datetime.fromtimestamp(1_700_000_001, UTC)
    assert row["last_failure"] == datetime.fromtimestamp(1_700_000_002, UTC)
    assert row["dead_lettered_at"] == datetime.fromtimestamp(1_700_000_003, UTC)
    assert (row["job"], row["batch_id"], row["attempts"]) == ("job", 4, 3)
    assert row["headers"] == [{"key": "trace", "value": b"1"}, {"key": "empty", "value": None}]
    assert row["redrive_id"] is None and row["redriven_at"] is None
