"""The crash harness's plan of rounds (tests/faults/harness.py): pure, no job is run."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "faults"))

from harness import plan_rounds

from retrylib.steps import BATCH_STEPS, START_STEPS


def test_a_sweep_meets_the_start_s_steps_first_in_their_order_then_each_batch_step():
    plan = plan_rounds(7, random_kills=2, broker_restarts=1)
    start = [(r.point, r.table) for r in plan[: len(START_STEPS) + 1]]
    assert start == [
        ("after_topics", None),
        ("after_lease", None),
        ("after_main_reader", None),
        ("after_identity", None),
        ("after_signing_key", None),
        ("in_table_create", "output"),
        ("in_table_create", "dead_letter"),
        ("after_query_start", None),
    ]
    rest = plan[len(start) :]
    assert sorted(r.point for r in rest if r.kind == "point") == sorted(BATCH_STEPS)
    assert [r.kind for r in rest].count("random") == 2
    assert [r.kind for r in rest].count("broker") == 1


def test_a_sweep_of_chosen_points_keeps_the_start_s_order():
    plan = plan_rounds(1, points=("after_manifest", "after_identity", "in_table_create"))
    names = [r.name for r in plan if r.kind == "point"]
    assert names[:3] == ["after_identity", "in_table_create:output", "in_table_create:dead_letter"]
    assert names[3:] == ["after_manifest"]


def test_a_soak_never_waits_for_a_table_s_creation_it_cannot_meet_again():
    plan = plan_rounds(3, rounds=60)
    points = {r.point for r in plan if r.kind == "point"}
    assert "in_table_create" not in points
    assert "after_query_start" in points and "after_manifest" in points
