"""Pure helpers for the benchmark's numbers and tables (no Spark, no Kafka)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0..100) by linear interpolation between closest ranks."""
    if not values:
        return None
    ordered = sorted(values)
    if len(ordered) == 1:
        return float(ordered[0])
    rank = (len(ordered) - 1) * q / 100
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def rate(records: int, seconds: float | None) -> float | None:
    return records / seconds if seconds and seconds > 0 else None


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    return numerator / denominator if numerator and denominator else None


def verdict(value: float | None, goal: float, *, at_most: bool = False) -> str:
    """ "met" when `value` reaches `goal`: at least it, or with `at_most` at most it."""
    if value is None:
        return "not measured"
    return "met" if (value <= goal if at_most else value >= goal) else "NOT met"


def fmt(value: object, digits: int = 1) -> str:
    """Numbers for tables: thousands separated, `digits` decimals for floats, '-' for None."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if math.isnan(value):
            return "-"
        return f"{value:,.{digits}f}"
    return str(value)


def table(headers: Sequence[str], rows: Iterable[Sequence[object]], title: str = "") -> str:
    """A plain-text table: columns padded, numbers right-aligned, text left-aligned."""
    cells = [[str(h) for h in headers]]
    numeric = [True] * len(headers)
    for row in rows:
        texts = []
        for i, value in enumerate(row):
            if isinstance(value, str):
                numeric[i] = numeric[i] and _looks_numeric(value)
                texts.append(value)
            else:
                texts.append(fmt(value))
        cells.append(texts)
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]

    def line(row: Sequence[str], header: bool) -> str:
        parts = [
            text.ljust(widths[i]) if header or not numeric[i] else text.rjust(widths[i])
            for i, text in enumerate(row)
        ]
        return "| " + " | ".join(parts) + " |"

    out = [title] if title else []
    for index, row in enumerate(cells):
        out.append(line(row, index == 0))
        if index == 0:
            out.append("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(out)


def _looks_numeric(text: str) -> bool:
    stripped = text.replace(",", "").replace(".", "").replace("×", "").replace("%", "").strip()
    return stripped == "-" or stripped.lstrip("-").isdigit()


def shares(parts: Mapping[str, float], whole: float) -> dict[str, float]:
    """Each part as a percentage of `whole` (0 when whole is 0)."""
    return {k: (100 * v / whole if whole else 0.0) for k, v in parts.items()}


def sum_counters(batches: Iterable[Mapping[str, object]], key: str = "counters") -> dict[str, int]:
    total: dict[str, int] = {}
    for batch in batches:
        for name, value in dict(batch.get(key) or {}).items():
            total[name] = total.get(name, 0) + int(value)
    return total


def lateness_ms(
    handled: Mapping[tuple[int, int], int], not_before: Mapping[tuple[int, int], int]
) -> tuple[list[int], int]:
    """handled_at - not_before per record present in both (keyed by origin partition,
    offset), and how many retried records have no handled row."""
    values = [handled[key] - due for key, due in not_before.items() if key in handled]
    return values, sum(1 for key in not_before if key not in handled)


def split_lateness(
    handled: Mapping[tuple[int, int], int],
    not_before: Mapping[tuple[int, int], int],
    trigger_starts_ms: Sequence[int],
) -> tuple[list[int], list[int]]:
    """Each retried record's lateness in two parts: from not-before to the start of the
    trigger that handled it (waiting for a trigger, or for the batch before it to end), and
    from that trigger's start to the handler call (planning and running the batch).

    The handling trigger is the last one that started at or before the handler call.
    Records handled before any known trigger start are left out.
    """
    starts = sorted(trigger_starts_ms)
    waits, inside = [], []
    for key, due in not_before.items():
        if key not in handled:
            continue
        at = handled[key]
        started = [s for s in starts if s <= at]
        if not started:
            continue
        waits.append(started[-1] - due)
        inside.append(at - started[-1])
    return waits, inside


def epoch_ms(iso: str) -> int:
    """Epoch ms of a StreamingQueryProgress timestamp like 2026-11-23T06:37:19.123Z."""
    from datetime import datetime

    return round(datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp() * 1000)


def batch_ends(progress: Iterable[Mapping[str, object]]) -> dict[int, float]:
    """{batch id: epoch seconds at which the trigger that ran it ended} from a query's
    progress entries (trigger start `timestamp` + `durationMs.triggerExecution`)."""
    ends = {}
    for p in progress:
        if p.get("timestamp") is None or p.get("batchId") is None:
            continue
        took = dict(p.get("durationMs") or {}).get("triggerExecution", 0)
        ends[int(p["batchId"])] = (epoch_ms(str(p["timestamp"])) + int(took)) / 1000
    return ends


def steady_rate(batches: Sequence[tuple[float, int]]) -> float | None:
    """Records per second after the first batch, from (end epoch s, records) per batch in
    order: the records of every later batch over the time from the first batch's end to the
    last one's. None with fewer than two batches."""
    if len(batches) < 2:
        return None
    return rate(sum(n for _, n in batches[1:]), batches[-1][0] - batches[0][0])


def full_batch_rate(batches: Sequence[tuple[int, float]], share: float = 0.5) -> float | None:
    """Records per second of trigger time over the full batches among (records, trigger
    seconds): those holding at least `share` of the largest one's records. Leaves out a
    small tail batch (the input left over after the last full batch), whose fixed costs
    would otherwise weigh on the rate as much as a full batch's."""
    if not batches:
        return None
    largest = max(n for n, _ in batches)
    full = [(n, s) for n, s in batches if n >= share * largest]
    return rate(sum(n for n, _ in full), sum(s for _, s in full))


FLAT_TOLERANCE = 0.10
"""How far (as a share) the last third's mean may be from the middle third's and be flat."""


def trend(values: Sequence[float | None]) -> str:
    """Whether a figure sampled over a long run stays put: "flat", "bounded" or "growing".

    The samples are cut in thirds; the first third (warm-up) is left out. "flat": the last
    third's mean is within `FLAT_TOLERANCE` of the middle third's. "growing": every sample
    of the last third is above every sample of the middle third (the level keeps rising).
    "bounded": neither (a saw-tooth, such as files between compactions, or noise around a
    level). "-" with fewer than 3 samples or a missing one.
    """
    if len(values) < 3 or any(v is None for v in values):
        return "-"
    numbers = [float(v) for v in values]  # type: ignore[arg-type]
    n = len(numbers)
    middle, last = numbers[n // 3 : 2 * n // 3], numbers[2 * n // 3 :]
    middle_mean, last_mean = sum(middle) / len(middle), sum(last) / len(last)
    if abs(last_mean - middle_mean) <= FLAT_TOLERANCE * abs(middle_mean):
        return "flat"
    return "growing" if min(last) > max(middle) else "bounded"


OLD_GEN_MARKERS = ("Old", "Tenured")
"""Words that name a JVM's old-generation heap pool: "G1 Old Gen", "PS Old Gen", "Tenured
Gen", "ZGC Old Generation"."""


def heap_figures(pools: Iterable[tuple[str, bool, int]], max_bytes: int) -> dict[str, float | None]:
    """The JVM's heap limit and the peak of its old generation, in MiB, from (pool name,
    is a heap pool, peak bytes used) of each memory pool (`MemoryPoolMXBean.getPeakUsage`)
    and the heap's max (-1: undefined).

    The old generation is where a batch's data ends up when the driver holds on to it (G1
    allocates large arrays there directly), so its peak is the closest the JVM's own counters
    come to "the most the driver held at once"; garbage not yet collected counts too.
    """
    old = [peak for name, heap, peak in pools if heap and any(m in name for m in OLD_GEN_MARKERS)]
    return {
        "heap_max_mb": round(max_bytes / 2**20, 1) if max_bytes > 0 else None,
        "old_gen_peak_mb": round(sum(old) / 2**20, 1) if old else None,
    }


def failure_cause(exit_code: int | None, log_text: str) -> str:
    """Why a contender's process failed, in a few words for a table cell: the exit code, and
    the first `java.lang.OutOfMemoryError` the log names (with its kind, e.g. "Java heap
    space") if any."""
    cause = f"exit {exit_code}"
    for line in log_text.splitlines():
        at = line.find("java.lang.OutOfMemoryError")
        if at >= 0:
            return f"{cause}, {line[at:].strip()}"
    return cause


def trigger_ms(progress: Iterable[Mapping[str, object]], rows: int | None = None) -> list[int]:
    """durationMs.triggerExecution of the batches that ran, in batch order, from a query's
    progress entries (an idle trigger's entry, with no input rows, repeats the id of the
    batch still to run and is left out); with `rows`, of those that read exactly that many
    input rows."""
    took = {}
    for p in progress:
        n = p.get("numInputRows")
        if p.get("batchId") is None or not n or (rows is not None and n != rows):
            continue
        took[int(p["batchId"])] = int(dict(p.get("durationMs") or {}).get("triggerExecution", 0))
    return [took[b] for b in sorted(took)]


def idle_triggers_ms(
    progress: Iterable[Mapping[str, object]], start_ms: int, end_ms: int
) -> list[int]:
    """triggerExecution of each progress entry with no input rows whose trigger started in
    [start_ms, end_ms]: the triggers of a quiet query."""
    return [
        int(dict(p.get("durationMs") or {}).get("triggerExecution", 0))
        for p in progress
        if p.get("timestamp")
        and not p.get("numInputRows")
        and start_ms <= epoch_ms(str(p["timestamp"])) <= end_ms
    ]


def changed(before: Mapping[str, object], after: Mapping[str, object]) -> list[str]:
    """The keys whose value differs between two snapshots (a key in only one counts)."""
    return sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))
