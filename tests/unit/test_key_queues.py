"""Key order (`retry.key_ordered`): the queues, the task's decisions, the key groups the
source plans, and the config's refusals. No Spark, no Kafka."""

from __future__ import annotations

import dataclasses
import json

import pytest
from helpers import TIER, problem_for, route

from retrylib.batch.key_order_store import stored_queues
from retrylib.kafka.offsets import OffsetRange, deal
from retrylib.record import Record
from retrylib.retry.headers import decode_retry_state, split_headers
from retrylib.retry.key_order import (
    KeyOrder,
    Queue,
    apply_changes,
    queues_from_json,
    queues_to_json,
)
from retrylib.source.key_groups import key_groups
from retrylib.state.checkpoint import expired_state
from retrylib.task.results import OUTGOING_KIND


def record(key: bytes | None, offset: int, topic: str = "orders", partition: int = 1) -> Record:
    return Record(key, b"v", [], topic, partition, offset, 0)


def test_a_key_without_a_queue_is_admitted_and_a_failure_blocks_it():
    order = KeyOrder()
    assert order.admit(record(b"k", 1))
    order.retried(record(b"k", 1), tier=0, not_before_ms=500)
    assert not order.admit(record(b"k", 2))
    assert order.admit(record(b"other", 3)) and order.admit(record(None, 4))
    assert order.hold(record(b"k", 2), now_ms=100) == (0, 500)
    assert order.queues[("orders", 1, b"k")] == Queue([1, 2], 0, 500)


def test_only_the_head_is_admitted_and_handling_it_passes_the_turn():
    order = KeyOrder()
    order.queues[("orders", 1, b"k")] = Queue([3, 7], 1, 900)
    assert not order.admit(record(b"k", 7))
    assert order.admit(record(b"k", 3))
    order.handled(record(b"k", 3))
    assert order.admit(record(b"k", 7))
    order.handled(record(b"k", 7))
    assert order.queues == {}
    [released] = order.changes().to_pylist()
    assert released == {
        "topic": "orders",
        "partition": 1,
        "key": b"k",
        "waiting": [],
        "tier": 0,
        "not_before_ms": 0,
    }


def test_a_head_that_fails_again_takes_its_queue_to_its_new_tier():
    order = KeyOrder()
    order.queues[("orders", 1, b"k")] = Queue([3, 7], 0, 900)
    order.retried(record(b"k", 3), tier=1, not_before_ms=5000)
    assert order.hold(record(b"k", 7), now_ms=1000) == (1, 5000)
    assert order.changes().to_pylist()[0]["waiting"] == [3, 7]


def test_a_failed_call_holds_the_keys_next_records_until_it_is_applied():
    order = KeyOrder()
    order.call_failed(record(b"k", 1))  # a lane's call failed; the outcome comes later
    assert not order.admit(record(b"k", 2))
    order.handled(record(b"k", 1))  # dead-lettered: the key is free, the held one heads
    assert order.hold(record(b"k", 2), now_ms=100) == (0, 100)
    assert order.queues[("orders", 1, b"k")].offsets == [2]


def test_keys_are_per_partition():
    order = KeyOrder()
    order.retried(record(b"k", 1, partition=0), tier=0, not_before_ms=1)
    assert order.admit(record(b"k", 2, partition=1))


def test_queues_survive_json_and_changes_fold_in():
    queues = {("orders", 1, b"\x00k"): Queue([1, 2], 1, 99)}
    payload = json.dumps(queues_to_json(queues.items()))
    assert queues_from_json(json.loads(payload)) == queues
    order = KeyOrder()
    order.load(payload.encode())  # as a key group's first range row carries them
    assert not order.admit(record(b"\x00k", 2)) and order.admit(record(b"\x00k", 1))
    apply_changes(
        queues,
        [
            {
                "topic": "orders",
                "partition": 1,
                "key": b"\x00k",
                "waiting": [],
                "tier": 0,
                "not_before_ms": 0,
            },
            {
                "topic": "orders",
                "partition": 0,
                "key": b"n",
                "waiting": [5],
                "tier": 0,
                "not_before_ms": 7,
            },
        ],
    )
    assert queues == {("orders", 0, b"n"): Queue([5], 0, 7)}


def tier_states(written: dict) -> list:
    """The retry states of the outgoing records to the first tier, in their order."""
    return [
        decode_retry_state(split_headers([(h["key"], h["value"]) for h in s["headers"]])[1])
        for s in written[OUTGOING_KIND]
        if s["topic"] == TIER
    ]


ROWS = [
    {"key": b"fail-k", "offset": 1},
    {"key": b"fail-k", "offset": 2},  # held behind offset 1: not called
    {"key": b"ok-1", "offset": 3},
    {"key": b"stop-s", "offset": 4},  # dead-lettered
    {"key": b"stop-s", "offset": 5},
]


def test_the_task_holds_a_blocked_keys_records_and_reports_its_queues(plan):
    ordered = dataclasses.replace(plan, key_ordered=True)
    counters, written = route(ordered, ROWS)
    # Handled one by one, each outcome applied at once: a dead letter never blocks its key.
    assert counters["held_behind_key"] == 1 and counters["dead_lettered"] == 2
    assert [row["key"] for row in written["output"]] == ["ok-1"]
    retried, held = tier_states(written)
    assert (retried.origin_offset, retried.attempt) == (1, 1)
    assert (held.origin_offset, held.attempt) == (2, 0)  # not an attempt
    assert held.not_before_ms == retried.not_before_ms  # due with its head
    [queue] = written["key_state"]
    assert (queue["key"], queue["waiting"], queue["tier"]) == (b"fail-k", [1, 2], 0)


def test_on_lanes_a_keys_next_record_is_held_until_its_failure_is_applied(plan):
    ordered = dataclasses.replace(plan, key_ordered=True, handler_parallelism=4)
    counters, written = route(ordered, ROWS)
    # The lanes decide before the outcomes are applied: stop-s@5 waits behind stop-s@4's
    # failure, and once that is a dead letter, heads its key's queue, due at once.
    assert counters["held_behind_key"] == 2 and counters["dead_lettered"] == 1
    retried, held, alone = tier_states(written)
    assert [(s.origin_offset, s.attempt) for s in (retried, held, alone)] == [
        (1, 1),
        (2, 0),
        (5, 0),
    ]
    assert alone.not_before_ms <= ordered.now_ms
    queues = {q["key"]: q["waiting"] for q in written["key_state"]}
    assert queues == {b"fail-k": [1, 2], b"stop-s": [5]}


def test_key_groups_join_a_main_partition_with_its_tier_partitions():
    ranges = [
        OffsetRange("orders", 0, 0, 5),
        OffsetRange("orders", 3, 0, 5),
        OffsetRange("orders.retry", 1, 0, 2),  # 3 mod 2: the retries of partition 3
        OffsetRange("orders.retry.1m", 0, 0, 1),  # 0 mod 1: partitions 0 to 3 retry here
    ]
    partitions = [("orders", p) for p in range(4)] + [
        ("orders.retry", 0),
        ("orders.retry", 1),
        ("orders.retry.1m", 0),
    ]
    tiers = {"orders": ["orders.retry", "orders.retry.1m"]}
    groups, group_of = key_groups(ranges, tiers, partitions)
    assert len(groups) == 1  # the one-partition tier joins every main partition
    assert [r.topic for r in groups[0]] == ["orders.retry", "orders.retry.1m", "orders", "orders"]
    assert group_of[("orders", 1)] == 0  # no range of its own, but its keys retry in it

    split, group_of = key_groups(ranges[:3], {"orders": ["orders.retry"]}, partitions[:6])
    assert sorted((r.topic, r.partition) for g in split for r in g) == sorted(
        (r.topic, r.partition) for r in ranges[:3]
    )
    assert len(split) == 2
    together = split[group_of[("orders", 3)]]
    assert [(r.topic, r.partition) for r in together] == [("orders.retry", 1), ("orders", 3)]
    # Partition 2's keys retry in the tier partition partition 0's keys do.
    assert group_of[("orders", 2)] == group_of[("orders", 0)]


def test_deal_keeps_items_whole_and_balances_them():
    dealt = deal([[5], [1, 1], [4]], 2, sum)
    assert sorted(map(sum, map(lambda bin: [x for item in bin for x in item], dealt))) == [5, 6]


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        ({"kafka.source": '"builtin"'}, 'needs kafka.source = "python"'),
        ({"kafka.source": '"python"', "handler.kind": '"pandas"'}, 'needs handler.kind = "record"'),
    ],
)
def test_key_order_refuses_what_cannot_keep_it(tmp_path, changes, expected):
    problem = problem_for(tmp_path, changes, extra="[retry]\nkey_ordered = true\n")
    assert "retry.key_ordered" in problem and expected in problem


def test_the_newest_two_key_queue_files_are_kept():
    names = ["3.json", "12.json", "7.json", "12.json.tmp-99", "notes.txt"]
    assert sorted(expired_state("key_order", names, 40)) == ["12.json.tmp-99", "3.json"]


def test_a_key_queue_file_cut_short_is_passed_over_for_the_one_before(tmp_path, caplog):
    older = {"batch_id": 3, "queues": [["orders", 1, "aw==", [5, 6], 0, 9]]}
    (tmp_path / "3.json").write_text(json.dumps(older))
    (tmp_path / "5.json").write_text('{"batch_id": 5, "queu')  # a crash while writing

    batch_id, queues = stored_queues(None, str(tmp_path))  # a local path needs no Spark

    assert (batch_id, queues) == (3, {("orders", 1, b"k"): Queue([5, 6], 0, 9)})
    assert "5.json is unreadable" in caplog.text
    assert stored_queues(None, str(tmp_path / "none")) is None
