"""The `outside` part of bench/run.py: each contender's run timed as a user times it, from the
launch of its process to its exit, on a small and a big input.

A user's run holds its start, its first batch (the JVM cold, its Python workers starting)
and every later batch; "steady" rates leave the first batch out and so disagree with what a
user sees by as much as that batch costs. Here the big run minus the small run cancels what
both pay once (start, first batch's warm-up) and leaves the pace a backlog moves at; the
small run's whole time is the start a user waits through.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence

from bench.report import fmt, ratio, table, verdict

CONTENDERS = (
    ("bare", "bare Spark: kafka -> delta"),
    ("mapinarrow", "hand-written: connector -> mapInArrow -> delta"),
    ("retrylib", "retrylib default (kafka.source auto)"),
    ("builtin", "retrylib, kafka.source builtin"),
    ("storm", "retrylib default, storm: every record fails once"),
)
"""(key, what runs) of each contender, in the order they run within a size."""
GOAL_PACE_VS_BARE = 1.2
GOAL_PACE_VS_HAND = 1.5
GOAL_START_VS_BARE = 1.1
GOAL_STORM_VS_SUCCEED = 0.8
"""Issues 44 and 68: a storm's pace over the same records' pace when they all succeed."""


def label(contender: str, records: int, round_: int) -> str:
    return f"outside-{contender}-{records}-r{round_}"


def topic(records: int, storm: bool) -> str:
    return f"bench-outside-{'storm-' if storm else ''}{records}"


def median_walls(walls: Mapping[str, float], contender: str, records: int) -> float | None:
    """The median whole-process time of `contender` on `records` over the rounds that ran
    (`walls`: seconds by run label)."""
    prefix = f"outside-{contender}-{records}-r"
    found = [seconds for name, seconds in walls.items() if name.startswith(prefix)]
    return statistics.median(found) if found else None


def paces(walls: Mapping[str, float], sizes: Sequence[int]) -> dict[str, dict[str, float | None]]:
    """Per contender: `small_s` and `big_s` (median whole runs; `small_s` is the start a user
    waits through) and `pace` (the records the big run has beyond the small one over the
    seconds it took beyond it)."""
    small, big = sizes
    out = {}
    for key, _ in CONTENDERS:
        small_s, big_s = median_walls(walls, key, small), median_walls(walls, key, big)
        extra = big_s - small_s if small_s is not None and big_s is not None else None
        out[key] = {
            "small_s": small_s,
            "big_s": big_s,
            "pace": (big - small) / extra if extra and extra > 0 else None,
        }
    return out


def outside_table(
    walls: Mapping[str, float], sizes: Sequence[int], rounds: int, cap: int | None
) -> str:
    figures = paces(walls, sizes)
    if not any(f["small_s"] for f in figures.values()):
        return ""
    bare, hand = figures["bare"], figures["mapinarrow"]
    rows = []
    for key, name in CONTENDERS:
        f = figures[key]
        rows.append(
            [
                name,
                f["small_s"],
                f["big_s"],
                round(f["pace"]) if f["pace"] else None,
                fmt(ratio(f["pace"], bare["pace"]), 2),
                fmt(ratio(f["pace"], hand["pace"]), 2),
                fmt(ratio(f["small_s"], bare["small_s"]), 2),
            ]
        )
    small, big = sizes
    text = table(
        [
            "contender",
            f"{small:,} rec, s",
            f"{big:,} rec, s",
            "pace rec/s",
            "pace x bare",
            "pace x hand-written",
            "start x bare",
        ],
        rows,
        f"As a user's run sees it (each run one process, launch to exit; median of {rounds} "
        f"round(s), contenders in turn; pace = ({big:,} - {small:,}) records over the big "
        f"run's seconds minus the small run's, so what both pay once cancels; start = the "
        f"{small:,}-record run; maxOffsetsPerTrigger {fmt(cap)}; the storm's records all fail "
        "once, each a retry record produced)",
    )
    ours, storm = figures["retrylib"], figures["storm"]
    pace_bare = ratio(ours["pace"], bare["pace"])
    pace_hand = ratio(ours["pace"], hand["pace"])
    start = ratio(ours["small_s"], bare["small_s"])
    storm_pace = ratio(storm["pace"], ours["pace"])
    lines = [
        "goals (issue 68), retrylib default, trivial handler:",
        f"  pace {fmt(pace_bare, 2)}x bare (>= {GOAL_PACE_VS_BARE}x: "
        f"{verdict(pace_bare, GOAL_PACE_VS_BARE)}), {fmt(pace_hand, 2)}x hand-written "
        f"(>= {GOAL_PACE_VS_HAND}x: {verdict(pace_hand, GOAL_PACE_VS_HAND)})",
        f"  start {fmt(start, 2)}x bare (<= {GOAL_START_VS_BARE}x: "
        f"{verdict(start, GOAL_START_VS_BARE, at_most=True)})",
        f"  storm pace {fmt(storm_pace, 2)}x the all-succeed pace (>= {GOAL_STORM_VS_SUCCEED}x: "
        f"{verdict(storm_pace, GOAL_STORM_VS_SUCCEED)})",
    ]
    return text + "\n" + "\n".join(lines)
