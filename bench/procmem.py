"""Peak memory and CPU time of a process tree, sampled from /proc (no psutil in the venv).

Memory is PSS (proportional set size, from /proc/PID/smaps_rollup): forked Python workers
share pages with their parent daemon, and PSS counts a shared page once across the tree
where summing RSS would count it in every process. RSS is kept too, for reference.
Processes are grouped: the root process is "driver", a `java` process is "jvm", any other
descendant (Spark's python daemon and workers) is "workers".
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field

_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def parse_stat(text: str) -> tuple[str, int, float]:
    """(comm, ppid, cpu seconds = utime + stime) from the text of /proc/PID/stat.

    The command name sits in parentheses and may itself hold spaces or parentheses, so the
    fields are counted from the last ')'.
    """
    close = text.rindex(")")
    comm = text[text.index("(") + 1 : close]
    rest = text[close + 2 :].split()
    # rest[0] is field 3 (state); ppid is field 4, utime 14, stime 15
    ppid = int(rest[1])
    cpu = (int(rest[11]) + int(rest[12])) / _CLOCK_TICKS
    return comm, ppid, cpu


def parse_kb(text: str, name: str) -> int | None:
    """The value in kB of line `name:` in /proc/PID/status or smaps_rollup text."""
    for line in text.splitlines():
        if line.startswith(name + ":"):
            return int(line.split()[1])
    return None


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def descendants(root: int, parents: dict[int, int]) -> set[int]:
    """`root` and every process below it, given pid -> ppid."""
    children: dict[int, list[int]] = {}
    for pid, ppid in parents.items():
        children.setdefault(ppid, []).append(pid)
    found, stack = set(), [root]
    while stack:
        pid = stack.pop()
        if pid in found:
            continue
        found.add(pid)
        stack.extend(children.get(pid, ()))
    return found


def classify(pid: int, root: int, comm: str) -> str:
    if pid == root:
        return "driver"
    if comm == "java":
        return "jvm"
    return "workers"


@dataclass
class TreeSample:
    pss_kb: dict[str, int]
    rss_kb: dict[str, int]
    processes: int


@dataclass
class TreeStats:
    """Peaks over the run, in MiB, and CPU seconds of every process seen in the tree."""

    peak_pss_mb: dict[str, float] = field(default_factory=dict)
    peak_rss_mb: dict[str, float] = field(default_factory=dict)
    peak_total_pss_mb: float = 0.0
    peak_total_rss_mb: float = 0.0
    cpu_seconds: dict[str, float] = field(default_factory=dict)
    max_processes: int = 0
    samples: int = 0

    def as_dict(self) -> dict:
        return {
            "peak_pss_mb": self.peak_pss_mb,
            "peak_rss_mb": self.peak_rss_mb,
            "peak_total_pss_mb": self.peak_total_pss_mb,
            "peak_total_rss_mb": self.peak_total_rss_mb,
            "cpu_seconds": self.cpu_seconds,
            "max_processes": self.max_processes,
            "samples": self.samples,
        }


class TreeSampler:
    """Samples the tree under `root` every `interval` seconds on a thread until `stop()`."""

    def __init__(self, root: int, interval: float = 0.2) -> None:
        self.root = root
        self.interval = interval
        self.stats = TreeStats()
        self._cpu: dict[int, tuple[str, float]] = {}  # pid -> (group, last cpu seconds)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="tree-sampler")

    def start(self) -> TreeSampler:
        self._thread.start()
        return self

    def stop(self) -> TreeStats:
        self._stop.set()
        self._thread.join()
        cpu: dict[str, float] = {}
        for group, seconds in self._cpu.values():
            cpu[group] = cpu.get(group, 0.0) + seconds
        self.stats.cpu_seconds = {k: round(v, 2) for k, v in sorted(cpu.items())}
        return self.stats

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.interval)

    def sample(self) -> TreeSample | None:
        stats = _all_stats()
        if self.root not in stats:
            return None
        tree = descendants(self.root, {pid: s[1] for pid, s in stats.items()})
        pss: dict[str, int] = {}
        rss: dict[str, int] = {}
        for pid in tree:
            comm, _, cpu = stats[pid]
            group = classify(pid, self.root, comm)
            self._cpu[pid] = (group, cpu)
            rollup = _read(f"/proc/{pid}/smaps_rollup") or ""
            p = parse_kb(rollup, "Pss")
            r = parse_kb(rollup, "Rss")
            if r is None:
                r = parse_kb(_read(f"/proc/{pid}/status") or "", "VmRSS") or 0
            pss[group] = pss.get(group, 0) + (p if p is not None else r)
            rss[group] = rss.get(group, 0) + r
        self._record(pss, rss, len(tree))
        return TreeSample(pss, rss, len(tree))

    def _record(self, pss: dict[str, int], rss: dict[str, int], processes: int) -> None:
        s = self.stats
        s.samples += 1
        s.max_processes = max(s.max_processes, processes)
        for group, kb in pss.items():
            s.peak_pss_mb[group] = max(s.peak_pss_mb.get(group, 0.0), round(kb / 1024, 1))
        for group, kb in rss.items():
            s.peak_rss_mb[group] = max(s.peak_rss_mb.get(group, 0.0), round(kb / 1024, 1))
        s.peak_total_pss_mb = max(s.peak_total_pss_mb, round(sum(pss.values()) / 1024, 1))
        s.peak_total_rss_mb = max(s.peak_total_rss_mb, round(sum(rss.values()) / 1024, 1))


def _all_stats() -> dict[int, tuple[str, int, float]]:
    stats = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            text = _read(f"/proc/{name}/stat")
            if text:
                try:
                    stats[int(name)] = parse_stat(text)
                except (ValueError, IndexError):
                    continue
    return stats


def tree_cpu_seconds(root: int) -> float | None:
    """CPU seconds used so far by `root` and its live descendants (the embedded broker is
    one `java` process; an external one has no PID here), or None if it is gone."""
    stats = _all_stats()
    if root not in stats:
        return None
    tree = descendants(root, {pid: s[1] for pid, s in stats.items()})
    return sum(stats[pid][2] for pid in tree)


def tree_cpu_by_group(root: int) -> dict[str, dict[int, float]]:
    """{group: {pid: CPU seconds so far}} for `root` and its live descendants."""
    stats = _all_stats()
    tree = descendants(root, {pid: s[1] for pid, s in stats.items()}) if root in stats else ()
    groups: dict[str, dict[int, float]] = {}
    for pid in tree:
        comm, _, cpu = stats[pid]
        groups.setdefault(classify(pid, root, comm), {})[pid] = cpu
    return groups


def cpu_between(
    before: dict[str, dict[int, float]], after: dict[str, dict[int, float]]
) -> dict[str, float]:
    """CPU seconds per group used between two `tree_cpu_by_group` snapshots (processes that
    started in between count from zero; ones that ended in between are missed)."""
    used = {}
    for group, pids in after.items():
        earlier = before.get(group, {})
        used[group] = round(sum(cpu - earlier.get(pid, 0.0) for pid, cpu in pids.items()), 2)
    return used


def machine_busy_seconds(text: str | None = None) -> float:
    """CPU seconds all CPUs spent not idle since boot, from the `cpu` line of /proc/stat
    (user + nice + system + irq + softirq + steal; idle and iowait left out)."""
    text = text if text is not None else (_read("/proc/stat") or "")
    for line in text.splitlines():
        if line.startswith("cpu "):
            fields = [int(v) for v in line.split()[1:]]
            user, nice, system, _idle, _iowait, irq, softirq = fields[:7]
            steal = fields[7] if len(fields) > 7 else 0
            return (user + nice + system + irq + softirq + steal) / _CLOCK_TICKS
    return 0.0
