"""Offset arithmetic of the Kafka source (retrylib.kafka.offsets) and its options; no Spark."""

from __future__ import annotations

import json
import random
import re
import time

import pytest
from helpers import FakeKafka, reader_for

from retrylib.kafka.arrow_records import KAFKA_SCHEMA, RANGE_SCHEMA
from retrylib.kafka.offsets import (
    AT_TIMESTAMP,
    EARLIEST,
    LATEST,
    MARKER_TAIL,
    FrontierScan,
    OffsetRange,
    StartingOffsets,
    cap_at_target,
    delay_frontier,
    floor_at,
    group_ranges,
    hidden_frontiers,
    limit_offsets,
    marker_tails,
    offsets_from_json,
    offsets_to_json,
    parse_starting_offsets,
    parse_topics,
    past_markers,
    progress_end_offsets,
    reached,
    resolve_starting_offsets,
    split_ranges,
    with_new_partitions,
)
from retrylib.source.options import parse_source_options

A0, A1, A2, B0 = ("a", 0), ("a", 1), ("a", 2), ("b", 0)


# --- subscribe and startingOffsets ---------------------------------------------------------


def test_parse_topics_strips_and_dedupes() -> None:
    assert parse_topics(" a, b ,a,,c ") == ["a", "b", "c"]


@pytest.mark.parametrize("value", [None, "", " , "])
def test_parse_topics_rejects_empty(value) -> None:
    with pytest.raises(ValueError, match="subscribe"):
        parse_topics(value)


@pytest.mark.parametrize(
    ("value", "default"),
    [(None, EARLIEST), ("earliest", EARLIEST), ("LATEST", LATEST), (" latest ", LATEST)],
)
def test_parse_starting_offsets_keywords(value, default) -> None:
    assert parse_starting_offsets(value, ["a"]) == StartingOffsets(default)


def test_parse_starting_offsets_json() -> None:
    spec = parse_starting_offsets('{"a": {"0": 23, "1": -2}, "b": {"0": -1}}', ["a", "b"])
    assert spec == StartingOffsets(EARLIEST, {A0: 23, A1: EARLIEST, B0: LATEST})


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("beginning", "not 'earliest', 'latest' or JSON"),
        ('{"a": {"0": 1}', "not 'earliest', 'latest' or JSON"),
        ("[1, 2]", "expected"),
        ('{"a": 5}', "topic 'a' must map"),
        ('{"a": {"x": 1}}', "partition 'x' of topic 'a' is not a number"),
        ('{"a": {"-1": 1}}', "partition '-1'"),
        ('{"a": {"0": -3}}', r"offset -3 of a\[0\] must be an integer >= -2"),
        ('{"a": {"0": "5"}}', "offset '5'"),
        ('{"a": {"0": true}}', "offset True"),
        ('{"zz": {"0": 1}}', r"topic\(s\) \['zz'\] that are not in subscribe"),
    ],
)
def test_parse_starting_offsets_errors_name_the_bad_input(value, message) -> None:
    with pytest.raises(ValueError, match=message) as error:
        parse_starting_offsets(value, ["a"])
    assert "startingOffsets" in str(error.value)


def test_resolve_starting_offsets() -> None:
    earliest = {A0: 5, A1: 0, A2: 7, B0: 0}
    latest = {A0: 50, A1: 60, A2: 70, B0: 80}
    parts = [B0, A2, A1, A0]
    assert resolve_starting_offsets(StartingOffsets(EARLIEST), parts, earliest, latest) == {
        A0: 5,
        A1: 0,
        A2: 7,
        B0: 0,
    }
    assert resolve_starting_offsets(StartingOffsets(LATEST), parts, earliest, latest) == latest
    spec = StartingOffsets(EARLIEST, {A0: 23, A1: LATEST, B0: EARLIEST})
    resolved = resolve_starting_offsets(spec, parts, earliest, latest)
    assert resolved == {A0: 23, A1: 60, A2: 7, B0: 0}  # a[2] not named: earliest
    assert list(resolved) == [A0, A1, A2, B0]


def test_resolve_starting_offsets_at_a_time_falls_back_to_the_end() -> None:
    earliest = {A0: 5, A1: 0, B0: 0}
    latest = {A0: 50, A1: 60, B0: 80}
    # a[1] has no record at or after the time (-1): it starts at its end; b[0] is named.
    spec = StartingOffsets(AT_TIMESTAMP, {B0: EARLIEST}, timestamp_ms=1_000)
    at_time = {A0: 17, A1: -1}
    resolved = resolve_starting_offsets(spec, [A0, A1, B0], earliest, latest, at_time)
    assert resolved == {A0: 17, A1: 60, B0: 0}


def test_resolve_starting_offsets_rejects_missing_partition() -> None:
    spec = StartingOffsets(EARLIEST, {("a", 9): 1})
    with pytest.raises(ValueError, match=r"a\[9\]"):
        resolve_starting_offsets(spec, [A0], {A0: 0}, {A0: 0})


# --- JSON form -----------------------------------------------------------------------------


def test_offsets_json_is_stable_and_round_trips() -> None:
    offsets = {("b", 10): 3, ("b", 2): 1, ("a", 0): 7}
    nested = offsets_to_json(offsets)
    assert json.dumps(nested) == '{"a": {"0": 7}, "b": {"2": 1, "10": 3}}'
    assert offsets_from_json(json.loads(json.dumps(nested))) == offsets
    assert json.dumps(offsets_to_json(dict(reversed(offsets.items())))) == json.dumps(nested)


def test_offsets_from_json_rejects_negative_offsets() -> None:
    with pytest.raises(ValueError, match=r"start offsets: offset -1 of a\[0\]"):
        offsets_from_json({"a": {"0": -1}}, what="start offsets")


# --- end offsets ---------------------------------------------------------------------------


def test_with_new_partitions_adds_missing_at_earliest() -> None:
    merged = with_new_partitions({A0: 10}, [A0, A1, A2], {A0: 0, A1: 3, A2: 0})
    assert merged == {A0: 10, A1: 3, A2: 0}


def test_delay_frontier_caps_at_latest() -> None:
    latest = {A0: 100, A1: 100, A2: 100}
    due = {A0: 40, A1: -1, A2: 150}  # -1: nothing at/after the time, everything is due
    assert delay_frontier(due, latest) == {A0: 40, A1: 100, A2: 100}


def test_hidden_frontiers_are_records_stamped_ahead_or_already_passed() -> None:
    latest = {A0: 100, A1: 100, A2: 100, B0: 100}
    frontier = {A0: 40, A1: 40, A2: 20, B0: 100}
    start = {A0: 30, A1: 30, A2: 60, B0: 90}
    first_stamped_ahead = {A0: 40, A1: 70, B0: 100}
    # A0's frontier is itself stamped ahead; A2's lies behind the start, where this reader
    # already passed it; A1's is a fair record not yet due; B0 has nothing left to read.
    assert hidden_frontiers(frontier, start, latest, first_stamped_ahead) == {A0: 40, A2: 60}


def test_a_frontier_scan_passes_over_records_stamped_ahead_to_the_first_not_due() -> None:
    scan = FrontierScan(due_before_ms=1_000, fair_until_ms=5_000)
    for offset, stamp in enumerate([900, 600_000, 950, 1_000, 10]):
        scan.see(A0, offset, stamp)
    for offset, stamp in enumerate([700_000, 999]):
        scan.see(A1, 10 + offset, stamp)
    scan.see(A2, 5, 500)

    assert scan.not_due == {A0: (3, 1_000)}  # what follows is not looked at
    assert scan.stamped_ahead == [(A0, 1, 600_000), (A1, 10, 700_000)]
    # A1 read to its end; A2 stopped (out of time) before its end, at offset 6
    moved = scan.moved({A0: 0, A1: 10, A2: 5}, {A0: 9, A1: 12, A2: 50}, {A2: 6})
    assert moved == {A0: 3, A1: 12, A2: 6}


def test_a_frontier_found_stands_while_it_is_not_due() -> None:
    found = {A0: (3, 1_000), A1: (7, 1_000), A2: (4, 999)}
    scan = FrontierScan(due_before_ms=1_000, fair_until_ms=5_000)
    # A1 begins past what was found (read again); A2's is due now; B0 was never read.
    assert scan.known({A0: 2, A1: 8, A2: 0, B0: 0}, found) == {A0: 3}
    assert scan.not_due == {A0: (3, 1_000)}


def test_marker_tails_are_the_short_tails_not_known_to_hold_records() -> None:
    latest = {A0: 100, A1: 100, A2: 100, B0: 100}
    frontier = {A0: 99, A1: 100, A2: 100 - MARKER_TAIL - 1, B0: 98}
    assert marker_tails(frontier, latest, {}) == {A0: (99, 100), B0: (98, 100)}
    # a tail read before and found to hold records is not read again, until it changes
    assert marker_tails(frontier, latest, {A0: (99, 100), B0: (97, 100)}) == {B0: (98, 100)}


def test_past_markers_moves_only_the_tails_without_records() -> None:
    latest = {A0: 100, A1: 100, A2: 100}
    assert past_markers({A0: 99, A1: 98, A2: 50}, latest, [A1]) == {A0: 99, A1: 100, A2: 50}


def test_floor_at_never_goes_below_start() -> None:
    assert floor_at({A0: 40, A1: 100, A2: 3}, {A0: 50, A1: 10}) == {A0: 50, A1: 100, A2: 3}


def test_cap_at_target() -> None:
    start = {A0: 10, A1: 50, A2: 0}
    end = {A0: 100, A1: 60, A2: 20}
    target = {A0: 80, A1: 40}  # a[1] target below start; a[2] appeared after the target
    assert cap_at_target(start, end, target) == {A0: 80, A1: 50, A2: 0}


# --- maxOffsetsPerTrigger ------------------------------------------------------------------


def test_limit_splits_by_backlog() -> None:
    start = {A0: 0, A1: 0, A2: 100}
    end = {A0: 150, A1: 75, A2: 175}
    assert limit_offsets(start, end, 100) == {A0: 50, A1: 25, A2: 125}


def test_limit_keeps_end_when_under_budget() -> None:
    end = {A0: 10, A1: 5}
    assert limit_offsets({A0: 0, A1: 5}, end, 10) == end


def test_limit_gives_every_backlogged_partition_a_record() -> None:
    start = {A0: 0, A1: 0, A2: 0, B0: 0}
    end = {A0: 10_000, A1: 1, A2: 2, B0: 0}
    limited = limit_offsets(start, end, 10)
    assert limited[A1] == 1 and limited[A2] >= 1 and limited[B0] == 0
    assert sum(limited.values()) == 10
    # a budget below the number of backlogged partitions still moves each of them by one
    assert limit_offsets(start, end, 2) == {A0: 1, A1: 1, A2: 1, B0: 0}


def test_limit_shares_add_up_and_stay_within_backlog() -> None:
    rng = random.Random(7)
    for _ in range(500):
        keys = [("t", p) for p in range(rng.randint(1, 8))]
        start = {k: rng.randint(0, 1000) for k in keys}
        end = {k: start[k] + rng.choice([0, 1, 2, rng.randint(0, 5000)]) for k in keys}
        budget = rng.randint(1, 6000)
        limited = limit_offsets(start, end, budget)
        backlogged = sum(1 for k in keys if end[k] > start[k])
        taken = sum(limited[k] - start[k] for k in keys)
        assert taken == min(sum(end[k] - start[k] for k in keys), max(budget, backlogged))
        assert all(start[k] <= limited[k] <= end[k] for k in keys)
        assert all(limited[k] > start[k] for k in keys if end[k] > start[k])


def test_limit_drains_a_partition_while_another_keeps_growing() -> None:
    start, end = {A0: 0, A1: 0}, {A0: 10_000, A1: 3}
    for _ in range(3):
        start = limit_offsets(start, end, 5)
        end = {A0: end[A0] + 1000, A1: 3}
    assert start[A1] == 3


def test_limit_rejects_non_positive_budget() -> None:
    with pytest.raises(ValueError, match="max_records"):
        limit_offsets({A0: 0}, {A0: 1}, 0)


# --- task ranges ---------------------------------------------------------------------------


def test_split_ranges_chunks_and_skips_empty() -> None:
    ranges = split_ranges({A0: 0, A1: 5, B0: 9}, {B0: 9, A1: 30, A0: 10}, 10)
    assert ranges == [
        OffsetRange("a", 0, 0, 10),
        OffsetRange("a", 1, 5, 15),
        OffsetRange("a", 1, 15, 25),
        OffsetRange("a", 1, 25, 30),
    ]


def test_split_ranges_rejects_non_positive_size() -> None:
    with pytest.raises(ValueError, match="max_records"):
        split_ranges({A0: 0}, {A0: 1}, 0)


def test_group_ranges_balances_record_counts_and_keeps_every_range() -> None:
    ranges = [
        OffsetRange("a", 0, 0, 100),
        OffsetRange("a", 1, 0, 60),
        OffsetRange("a", 2, 0, 50),
        OffsetRange("b", 0, 10, 20),
    ]
    groups = group_ranges(ranges, 2)
    assert [sum(r.end - r.start for r in g) for g in groups] == [110, 110]
    assert {r for g in groups for r in g} == set(ranges)
    assert sum(len(g) for g in groups) == len(ranges)


def test_group_ranges_makes_no_empty_groups() -> None:
    ranges = [OffsetRange("a", 0, 0, 5)]
    assert group_ranges(ranges, 4) == [ranges]
    assert group_ranges([], 2) == []
    with pytest.raises(ValueError, match="groups must be >= 1"):
        group_ranges(ranges, 0)


# --- source options ------------------------------------------------------------------------

BASE = {"kafka.bootstrap.servers": "h:9092", "subscribe": "a,b"}


def test_source_options_parse_and_pass_kafka_settings_through() -> None:
    options = parse_source_options(
        {
            **BASE,
            "STARTINGOFFSETS": "latest",
            "maxOffsetsPerTrigger": "500",
            "retrylib.topicDelaysMs": '{"b": 5000}',
            "kafka.security.protocol": "SSL",
        }
    )
    assert options.bootstrap_servers == "h:9092"
    assert options.topics == ["a", "b"]
    assert options.starting_offsets == StartingOffsets(LATEST)
    assert (options.max_offsets_per_trigger, options.delays_ms) == (500, {"b": 5000})
    assert options.max_records_per_task == 250_000
    assert options.read_ahead_ms == 0
    assert options.client_options == {"security.protocol": "SSL"}
    assert options.schema == KAFKA_SCHEMA


def test_a_delay_tier_is_read_up_to_what_is_due_by_now_plus_the_read_ahead() -> None:
    asked = []

    class Kafka(FakeKafka):
        def list_offsets(self, partitions, timestamp: int):
            asked.append(timestamp)
            return super().list_offsets(partitions, timestamp)

    reader = reader_for(
        Kafka({("orders", 0): 40}, due={("orders", 0): 12}),
        **{"retrylib.topicDelaysMs": '{"orders": 5000}', "retrylib.readAheadMs": "2000"},
    )
    before = int(time.time() * 1000)
    end = reader.latestOffset({"orders": {"0": 0}}, None)
    after = int(time.time() * 1000)
    assert end == {"orders": {"0": 12}}
    due_by = next(timestamp for timestamp in asked if timestamp not in (EARLIEST, LATEST))
    assert before + 2000 - 5000 <= due_by <= after + 2000 - 5000


def stamped_kafka(ahead_ms: int) -> FakeKafka:
    """orders[0] with six records: offset 1 stamped `ahead_ms` ahead of now, offset 5 not due
    on a 5s delay tier, the rest due."""
    now = int(time.time() * 1000)
    stamps = [now - 9_000, now + ahead_ms, now - 8_000, now - 7_000, now - 6_000, now - 1_000]
    return FakeKafka({("orders", 0): 6}, stamps={("orders", 0): stamps})


def test_a_record_stamped_ahead_hides_no_record_behind_it(caplog) -> None:
    kafka = stamped_kafka(600_000)
    # A handler job's producers stamp a tier's records up to one delay ahead; 10 minutes is
    # further than any of them would.
    reader = reader_for(kafka, **{"retrylib.topicDelaysMs": '{"orders": 5000}'})

    assert reader.latestOffset({"orders": {"0": 0}}, None) == {"orders": {"0": 5}}
    assert kafka.scanned == [{("orders", 0): 1}]
    [warned] = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert re.match(
        r"orders\[0\]: the record at offset 1 has a Kafka timestamp (10m|9m59s) ahead", warned
    )
    # The next batch starts past it, and the index still answers with it: the frontier the
    # read found stands, not due yet, and is not read again.
    assert reader.latestOffset({"orders": {"0": 2}}, None) == {"orders": {"0": 5}}
    assert len(kafka.scanned) == 1


@pytest.mark.parametrize(("stamps_ahead", "end"), [("true", 1), ("false", 5)])
def test_how_far_ahead_a_record_may_be_stamped_depends_on_its_producer(stamps_ahead, end) -> None:
    # 3s ahead on a 5s tier: a handler job stamps so (not due yet); a delay router never does.
    kafka = stamped_kafka(3_000)
    options = {
        "retrylib.topicDelaysMs": '{"orders": 5000}',
        "retrylib.tierStampsAhead": stamps_ahead,
    }
    reader = reader_for(kafka, **options)

    assert reader.latestOffset({"orders": {"0": 0}}, None) == {"orders": {"0": end}}


def test_source_starting_timestamp_wins_over_starting_offsets() -> None:
    options = parse_source_options(
        {**BASE, "startingOffsets": "latest", "startingTimestamp": "1700000000000"}
    )
    assert options.starting_offsets == StartingOffsets(AT_TIMESTAMP, timestamp_ms=1_700_000_000_000)
    assert options.fail_on_data_loss is True


def test_source_reads_a_pattern_with_or_without_named_topics() -> None:
    pattern_only = parse_source_options(
        {"kafka.bootstrap.servers": "h:9092", "subscribePattern": "o.*"}
    )
    assert (pattern_only.topics, pattern_only.topic_pattern) == ([], "o.*")
    both = parse_source_options(
        {**BASE, "subscribePattern": "o.*", "startingOffsets": '{"o1": {"0": 3}}'}
    )
    assert (both.topics, both.topic_pattern) == (["a", "b"], "o.*")
    assert both.starting_offsets == StartingOffsets(EARLIEST, {("o1", 0): 3})


def test_source_fail_on_data_loss_is_read_as_spark_spells_it() -> None:
    assert parse_source_options({**BASE, "FAILONDATALOSS": "False"}).fail_on_data_loss is False


def test_source_emits_offset_ranges_when_asked() -> None:
    options = parse_source_options({**BASE, "retrylib.emit": "Ranges", "retrylib.rangeGroups": "2"})
    assert (options.emit_ranges, options.range_groups) == (True, 2)
    assert options.schema == RANGE_SCHEMA


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"subscribe": "a"}, "kafka.bootstrap.servers is required"),
        ({**BASE, "assign": '{"a": [0]}'}, "unknown option 'assign'"),
        ({**BASE, "subscribePattern": "a(["}, r"option subscribePattern='a\(\[':"),
        ({**BASE, "kafka.auto.offset.reset": "latest"}, "kafka.auto.offset.reset"),
        ({**BASE, "maxOffsetsPerTrigger": "0"}, r"maxOffsetsPerTrigger='0' must be"),
        ({**BASE, "retrylib.topicDelaysMs": "soon"}, "must be a JSON object of topic: delay"),
        ({**BASE, "retrylib.topicDelaysMs": '{"c": 5}'}, "names 'c', which is not subscribed"),
        ({**BASE, "retrylib.topicDelaysMs": '{"a": -1}'}, "delay of 'a' must be an integer"),
        ({**BASE, "retrylib.topicDelaysMs": '{"a": 1.5}'}, "delay of 'a' must be an integer"),
        ({**BASE, "retrylib.maxRecordsPerTask": "-5"}, "retrylib.maxRecordsPerTask='-5'"),
        ({**BASE, "startingOffsets": "{}x"}, "startingOffsets"),
        ({**BASE, "retrylib.emit": "rows"}, r"retrylib.emit='rows' must be one of"),
        ({**BASE, "retrylib.rangeGroups": "0"}, r"retrylib.rangeGroups='0' must be"),
        ({**BASE, "startingTimestamp": "yesterday"}, r"startingTimestamp='yesterday' must be"),
        ({**BASE, "failOnDataLoss": "maybe"}, r"failOnDataLoss='maybe' must be true or false"),
    ],
)
def test_source_options_errors_name_the_option(options, message) -> None:
    with pytest.raises(ValueError, match=message):
        parse_source_options(options)


def test_reached_needs_every_target_partition_at_or_past_its_offset() -> None:
    target = {("a", 0): 5, ("b", 1): 0}

    assert reached({("a", 0): 5, ("b", 1): 0, ("c", 0): 1}, target)
    assert reached({("a", 0): 9, ("b", 1): 3}, target)
    assert not reached({("a", 0): 4, ("b", 1): 3}, target)
    assert not reached({("a", 0): 5}, target)


def test_progress_end_offsets_merges_sources_given_as_objects_or_json_text() -> None:
    progress = json.dumps(
        {
            "sources": [
                {"endOffset": {"main": {"0": 7, "1": 3}}},
                {"endOffset": '{"main.retry.1s": {"0": 2}}'},
                {"endOffset": None},
                {"endOffset": "not offsets"},
            ]
        }
    )

    assert progress_end_offsets(progress) == {
        ("main", 0): 7,
        ("main", 1): 3,
        ("main.retry.1s", 0): 2,
    }
