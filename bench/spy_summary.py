"""Summarise a py-spy profile of a retrylib run: where the Python CPU time goes, by role.

    .venv/bin/pip install py-spy
    PYTHONPATH=. .venv/bin/py-spy record --subprocesses --format raw --rate 100 -o prof.txt \
        -- .venv/bin/python -m bench.retrylib_driver CONFIG RESULT_JSON
    .venv/bin/python -m bench.spy_summary prof.txt [--top 12]

Each sample is put in one role by the frames on its stack: the source read (a Python data
source task: `read_range`), the routing task (`run_task`: handler, routing, result rows), the
driver (the foreachBatch body and everything else in the driver process), source planning
(the Python data source's driver-side runner) or other worker time (starting, idle
serialisation). Within a role a sample is charged to its innermost frame in retrylib/ or
bench/ code (so the user's handler shows as bench/handlers.py), else to its innermost
frame (a library function called from the framework).
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import Counter, defaultdict

_FRAME = re.compile(r"^(?P<func>.*) \((?P<file>[^()]*?):(?P<line>\d+)\)$")
_OURS = ("retrylib/", "bench/")


def parse_line(line: str) -> tuple[list[str], int] | None:
    """(frames outermost first, sample count) of one raw/collapsed line."""
    line = line.rstrip("\n")
    if not line:
        return None
    stack, _, count = line.rpartition(" ")
    if not count.isdigit():
        return None
    return stack.split(";"), int(count)


def role(frames: list[str]) -> str:
    processes = [f for f in frames if f.startswith("process ")]
    process = processes[-1] if processes else ""
    code = ";".join(f for f in frames if not f.startswith("process "))
    if "read_range" in code or "plan_data_source_read" in code:
        return "source read task"
    if "run_task" in code:
        return "routing task (mapInArrow)"
    if "zipimport" in code or "importlib" in code:
        return "imports (process and worker start)"
    if "pyspark.daemon" in process or "pyspark.worker" in process:
        if "manager (daemon.py" in code and "worker (daemon.py" not in code:
            return "pyspark daemon (forking workers)"
        if "streaming" in code and "source" in code:
            return "source planning (driver side)"
        return "worker, outside a task"
    if "retrylib_driver" in process or "-m retrylib " in process:
        return "driver process"
    return "other"


def charge(frames: list[str]) -> str:
    """The frame a sample is charged to: innermost of ours, else the leaf."""
    code = [f for f in frames if not f.startswith("process ")]
    for frame in reversed(code):
        m = _FRAME.match(frame)
        if m and m["file"].startswith(_OURS):
            return f"{m['func']} ({m['file']})"
    if not code:
        return "(no Python frame)"
    m = _FRAME.match(code[-1])
    return f"{m['func']} ({m['file']})" if m else code[-1]


def leaf(frames: list[str]) -> str:
    code = [f for f in frames if not f.startswith("process ")]
    if not code:
        return "(no Python frame)"
    m = _FRAME.match(code[-1])
    return f"{m['func']} ({m['file']}:{m['line']})" if m else code[-1]


def summarise(lines, top: int = 12) -> str:
    by_role: Counter[str] = Counter()
    charged: dict[str, Counter[str]] = defaultdict(Counter)
    leaves: dict[str, Counter[str]] = defaultdict(Counter)
    for line in lines:
        parsed = parse_line(line)
        if parsed is None:
            continue
        frames, count = parsed
        r = role(frames)
        by_role[r] += count
        charged[r][charge(frames)] += count
        leaves[r][leaf(frames)] += count
    total = sum(by_role.values()) or 1
    out = [f"{total} samples"]
    for r, n in by_role.most_common():
        out.append(f"\n{r}: {n} samples, {100 * n / total:.1f}% of all")
        for name, c in charged[r].most_common(top):
            out.append(f"  {100 * c / n:5.1f}%  {name}")
        out.append("  leaf functions:")
        for name, c in leaves[r].most_common(max(top // 2, 3)):
            out.append(f"    {100 * c / n:5.1f}%  {name}")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench.spy_summary")
    p.add_argument("profile", help="py-spy --format raw output")
    p.add_argument("--top", type=int, default=12)
    args = p.parse_args(argv)
    with open(args.profile) as f:
        print(summarise(f, args.top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
