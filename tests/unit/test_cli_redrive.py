"""How `retrylib redrive` picks dead letters and updates its table, without Spark: the
selection's Spark SQL condition as text, and the UPDATE's retries on Delta commit conflicts.
The same conditions run against a real table in `tests/integration/test_redrive.py`.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest
from delta.exceptions import ConcurrentAppendException, ConcurrentDeleteReadException

import retrylib.ops.redrive as redrive_module
import retrylib.sinks.dead_letter_table as table_module
from retrylib.config.table_ref import TableRef
from retrylib.ops.redrive import Selection
from retrylib.sinks.dead_letter_table import DeadLetterTable

NOW = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)
UNCLAIMED = "redrive_id IS NULL AND redriven_at IS NULL"


def test_no_filter_picks_every_row_not_claimed():
    assert Selection().predicate() == UNCLAIMED


def test_time_range_is_half_open_with_utc_timestamp_literals():
    since = datetime(2026, 5, 1, 14, 0, tzinfo=timezone(timedelta(hours=2)))

    predicate = Selection(since=since, until=NOW).predicate()

    assert predicate == (
        f"{UNCLAIMED} AND dead_lettered_at >= TIMESTAMP'2026-05-01T12:00:00+00:00' "
        "AND dead_lettered_at < TIMESTAMP'2026-05-01T12:00:00+00:00'"
    )


def test_naive_times_are_utc():
    naive = datetime(2026, 5, 1, 10, 30)

    assert (
        Selection(until=naive)
        .predicate()
        .endswith("dead_lettered_at < TIMESTAMP'2026-05-01T10:30:00+00:00'")
    )


def test_error_class_matches_the_full_or_the_short_name():
    predicate = Selection(error_classes=("ValueError", "shop.PriceError")).predicate()

    assert predicate == (
        f"{UNCLAIMED} AND (error_class IN ('ValueError', 'shop.PriceError') OR "
        "endswith(error_class, '.ValueError') OR endswith(error_class, '.shop.PriceError'))"
    )


def test_quotes_and_backslashes_in_values_are_escaped():
    predicate = Selection(ids=("it's", "back\\slash")).predicate()

    assert predicate.endswith("id IN ('it\\'s', 'back\\\\slash')")


def test_origin_topic_partition_offsets_and_keys_narrow_the_rows():
    predicate = Selection(
        topics=("orders", "it's"), keys=("k1", "ü"), partition=3, offsets=(100, 199)
    ).predicate()

    assert predicate == (
        f"{UNCLAIMED} AND origin_topic IN ('orders', 'it\\'s') "
        "AND key IN (CAST('k1' AS BINARY), CAST('ü' AS BINARY)) "
        "AND origin_partition = 3 AND origin_offset BETWEEN 100 AND 199"
    )


@pytest.mark.parametrize(
    "selection, message",
    [
        ({"offsets": (1, 2)}, "--offsets: name the partition too"),
        ({"partition": 0, "offsets": (5, 4)}, "the first offset is after the last, got 5-4"),
        ({"limit": 0}, "--limit: at least 1, got 0"),
    ],
)
def test_a_selection_that_cannot_pick_as_meant_is_refused(selection, message):
    with pytest.raises(redrive_module.RedriveError, match=message):
        Selection(**selection)


def test_the_command_line_names_the_filters(capsys):
    from retrylib.ops.cli import _parser

    args = _parser().parse_args(
        ["redrive", "job.toml", "--topic", "a", "--topic", "b", "--key", "k", "--partition", "2"]
        + ["--offsets", "10-20", "--limit", "5"]
    )
    assert (args.topic, args.key, args.partition, args.offsets, args.limit) == (
        ["a", "b"],
        ["k"],
        2,
        (10, 20),
        5,
    )
    with pytest.raises(SystemExit):
        _parser().parse_args(["redrive", "job.toml", "--offsets", "10"])
    assert "expected FIRST-LAST offsets like 100-199, got '10'" in capsys.readouterr().err


class FakeUpdates:
    """Stands for `update_where`: raises the queued errors first, then records the UPDATE."""

    def __init__(self, *errors: Exception) -> None:
        self.errors = list(errors)
        self.calls: list[tuple[str, dict[str, str]]] = []

    def __call__(self, spark, ref, condition, set_values) -> None:
        self.calls.append((condition, dict(set_values)))
        if self.errors:
            raise self.errors.pop(0)


@pytest.fixture
def updates(monkeypatch):
    def install(*errors: Exception) -> FakeUpdates:
        fake = FakeUpdates(*errors)
        monkeypatch.setattr(table_module, "update_where", fake)
        monkeypatch.setattr(table_module.time, "sleep", lambda seconds: None)
        return fake

    return install


def dead_letters() -> DeadLetterTable:
    return DeadLetterTable(None, TableRef.parse("/tmp/dlq", "dead_letter.table"))


def test_an_update_that_loses_a_race_runs_again(updates):
    fake = updates(ConcurrentAppendException("appended"), ConcurrentDeleteReadException("gone"))

    dead_letters().update("id = 'a'", {"redrive_id": "'r1'"})

    assert fake.calls == [("id = 'a'", {"redrive_id": "'r1'"})] * 3


def test_an_update_gives_up_after_five_conflicts(updates):
    fake = updates(*(ConcurrentAppendException(f"race {i}") for i in range(5)))

    with pytest.raises(ConcurrentAppendException, match="race 4"):
        dead_letters().update("id = 'a'", {"redrive_id": "'r1'"})
    assert len(fake.calls) == 5


def test_other_update_errors_are_not_retried(updates):
    fake = updates(ValueError("no such column"))

    with pytest.raises(ValueError, match="no such column"):
        dead_letters().update("nope = 1", {"redrive_id": "'r1'"})
    assert len(fake.calls) == 1


def test_confirm_sets_redriven_at_as_a_utc_timestamp_literal(updates):
    fake = updates()

    redrive_module._confirm(dead_letters(), "r'1", int(NOW.timestamp() * 1000))

    assert fake.calls == [
        (
            "redrive_id = 'r\\'1' AND redriven_at IS NULL",
            {"redriven_at": "TIMESTAMP'2026-05-01T12:00:00+00:00'"},
        )
    ]


def test_a_bad_target_topic_is_refused_before_any_table_is_read():
    with pytest.raises(redrive_module.RedriveError, match="--to: not a Kafka topic name"):
        redrive_module.redrive(None, Selection(), to="bad topic!")


def test_a_pace_spaces_records_by_its_rate_from_the_first():
    now, slept = [100.0], []

    def sleep(seconds: float) -> None:
        slept.append(round(seconds, 3))
        now[0] += seconds

    pace = redrive_module.Pace(4.0, clock=lambda: now[0], sleep=sleep)
    for sent in range(3):
        pace.wait(sent)
    now[0] += 2.0  # the producer was slow: no wait for what is overdue
    pace.wait(3)

    assert slept == [0.25, 0.25]
    redrive_module.Pace(None, clock=lambda: 0.0, sleep=sleep).wait(10)  # no rate: no wait
    assert slept == [0.25, 0.25]


@pytest.mark.parametrize("rate", [0.0, -1.0, float("nan")])
def test_a_rate_that_sends_nothing_is_refused(rate):
    with pytest.raises(redrive_module.RedriveError, match="--rate: records a second, more than 0"):
        redrive_module.redrive(None, Selection(), rate=rate)


def test_a_dry_run_shows_its_error_classes_and_first_rows_and_what_a_limit_leaves():
    from retrylib.ops.render import render_redrive

    rows = [
        {
            "id": f"id-{i}",
            "dead_lettered_at": NOW,
            "error_class": "builtins.ValueError" if i % 3 else "shop.PriceError",
            "origin_topic": "orders",
            "origin_partition": 0,
            "origin_offset": i,
            "redrive_topic": "orders",
        }
        for i in range(25)
    ]
    report = redrive_module.RedriveReport(dry_run=True, selected=rows, left=75)

    lines = render_redrive(report).splitlines()

    assert lines[:2] == [
        "dry run: 25 record(s) would be redriven; nothing was sent or changed",
        "by error class: builtins.ValueError 16, shop.PriceError 9",
    ]
    assert sum(line.startswith("  id-") for line in lines) == 20
    assert lines[-2:] == [
        "... and 5 more (--json lists them all)",
        "75 more record(s) match but would be left for the next run (--limit or --rate)",
    ]


def test_records_redriven_enough_times_are_left_out_and_counted_apart():
    selection = Selection(ids=("a",), redrives_below=3, limit=5)
    came_back = (
        "coalesce(exists(headers, h -> h.key = 'retrylib.redrives' AND "
        "coalesce(try_cast(cast(h.value AS STRING) AS INT) >= 3, false)), false)"
    )

    assert selection.predicate() == f"{UNCLAIMED} AND id IN ('a') AND NOT {came_back}"
    assert selection.looping() == f"{UNCLAIMED} AND id IN ('a') AND {came_back}"


@pytest.mark.parametrize(
    "headers, sent",
    [
        ([("trace", b"t")], [("trace", b"t"), ("retrylib.redrives", b"1")]),
        (
            [("retrylib.redrives", b"2"), ("retrylib.attempt", b"3"), ("trace", None)],
            [("trace", None), ("retrylib.redrives", b"3")],
        ),
        (
            [("retrylib.redrives", b"\xff"), ("retrylib.redrives", b"")],
            [("retrylib.redrives", b"1")],
        ),
    ],
)
def test_a_redriven_record_carries_its_redrive_count_last(headers, sent):
    from retrylib.retry.headers import redriven_headers

    assert redriven_headers(headers) == sent
