"""Text and JSON for the terminal: what `retrylib status` found and `retrylib redrive` did,
a redrive's progress, and what a job does (`retrylib check`)."""

from __future__ import annotations

import json
import sys
import time
from collections import Counter
from collections.abc import Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any, TextIO

from retrylib.config.durations import format_duration

if TYPE_CHECKING:
    from retrylib.ops.redrive import RedriveReport


def render_status(status: Mapping[str, Any]) -> str:
    """`status` (from `collect_status`) as text for a terminal."""
    lines = [f"job {status['job']}   checkpoint {status['checkpoint']}"]
    batch = status["last_completed_batch"]
    if not batch:
        lines.append("last completed batch: none yet")
    elif batch.get("damaged"):
        lines.append(f"last completed batch: {batch['id']} (its offsets: {batch['damaged']})")
    else:
        lines.append(f"last completed batch: {batch['id']} (triggered {batch['triggered_at']})")
    broker = status["broker"]
    if broker["reachable"]:
        lines.append(f"broker {broker['bootstrap_servers']}: reachable")
    else:
        lines.append(f"broker {broker['bootstrap_servers']}: NOT reachable ({broker['error']})")
    if status["main_topics"]:
        lines += ["", "main topics"]
        rows = [("topic", "partitions", "lag")]
        for topic in status["main_topics"]:
            lag = "-" if topic["lag"] is None else str(topic["lag"])
            partitions = str(topic["partitions"]) if topic["exists"] else "missing"
            rows.append((topic["topic"], partitions, lag))
        lines += _table(rows)
    if status["retry_tiers"]:
        lines += ["", "retry tiers"]
        lines += _waiting_table(
            "tier", [str(t["tier"]) for t in status["retry_tiers"]], status["retry_tiers"]
        )
        lines += [f"  warning: {text}" for text in overdue_tiers(status["retry_tiers"])]
        lines += [f"  warning: {text}" for text in stamped_ahead(status["retry_tiers"])]
        missing = [t for tier in status["retry_tiers"] for t in tier["missing_topics"]]
        if missing:
            lines.append(f"  missing retry topics (created when the job starts): {missing}")
    if status["delay_topics"]:
        lines += ["", "delay topics"]
        delayed = status["delay_topics"]
        lines += _waiting_table("topic", [t["topics"][0] for t in delayed], delayed)
        lines += [f"  warning: {text}" for text in stamped_ahead(delayed)]
        missing = [t for topic in status["delay_topics"] for t in topic["missing_topics"]]
        if missing:
            lines.append(f"  missing delay topics (create them): {missing}")
    lines += _dead_letter_lines(status["dead_letters"])
    lines += _breaker_lines(status["breaker"])
    lines += _key_order_lines(status["key_order"])
    lines += _batch_lines(status["last_batches"])
    return "\n".join(lines)


def _waiting_table(heading: str, names: list[str], entries: list[Mapping[str, Any]]) -> list[str]:
    """Records waiting out a delay (retry tiers, or a delay router's topics), a row each,
    named in a first column with `heading`."""
    rows = [(heading, "delay", "waiting", "due", "oldest waiting", "next due")]
    for name, entry in zip(names, entries, strict=True):
        rows.append(
            (
                name,
                entry["delay"],
                str(entry["waiting"]) + ("" if entry["exact"] else "+"),
                str(entry["due"]),
                _ago(entry["oldest_waiting_age_seconds"]),
                _due(entry["next_due_in_seconds"]),
            )
        )
    return _table(rows)


def _dead_letter_lines(dead: Mapping[str, Any] | None) -> list[str]:
    if dead is None:  # a delay router
        return []
    lines = [""]
    if not dead["exists"]:
        lines.append(f"dead letters: no table {dead['table']} yet")
    else:
        waiting = f"{dead['waiting']} waiting"
        age_s = dead["oldest_waiting_age_seconds"]
        if age_s is not None:
            waiting += f" (the oldest for {format_duration(age_s * 1000)})"
        if dead["looping"]:
            waiting += f", {dead['looping']} of them back after dead_letter.max_redrives redrives"
        lines.append(
            f"dead letters: {dead['total']} in {dead['table']}, {dead['redriven']} redriven, "
            + waiting
        )
        if dead["by_error_class"]:
            rows = [("error class", "records", "redriven", "last")]
            for c in dead["by_error_class"]:
                rows.append(
                    (
                        c["error_class"] or "-",
                        str(c["records"]),
                        str(c["redriven"]),
                        c["last_dead_lettered_at"] or "-",
                    )
                )
            lines += _table(rows)
    return lines


_COUNT_HEADINGS = {
    "records_main": "in main",
    "records_retry": "in retry",
    "succeeded": "ok",
    "retried": "retried",
    "dead_lettered": "dead",
    "duplicates_skipped": "dup",
    "records_delayed": "in",
    "forwarded": "forwarded",
    "requeued_not_due": "held",
    "forwarded_to_fallback": "fallback",
    "unroutable": "unroutable",
}


def _breaker_lines(breaker: Mapping[str, Any] | None) -> list[str]:
    if breaker is None:
        return []
    if breaker["state"] is None:
        return ["", f"breaker: unknown ({breaker['why']})"]
    line = f"breaker: {breaker['state']} since {breaker['since']} ({breaker['why']})"
    if breaker["next_probe_at"] is not None:
        line += f"; next probe at {breaker['next_probe_at']}"
    return ["", line]


def _key_order_lines(key_order: Mapping[str, Any] | None) -> list[str]:
    if key_order is None:
        return []
    if not key_order["blocked_keys"]:
        return ["", "key order: no key waits behind a retry"]
    lines = [
        "",
        f"key order: {key_order['blocked_keys']} key(s) wait behind a retry, "
        f"{key_order['held_records']} record(s) held behind them (after batch "
        f"{key_order['after_batch']}); longest:",
    ]
    lines += [
        f"  {q['topic']}[{q['partition']}] key {q['key']!r}: {q['waiting']} waiting, the first "
        f"in tier {q['tier']}, due {q['due_at']}"
        for q in key_order["longest_queues"]
    ]
    return lines


def _batch_lines(recent: Mapping[str, Any]) -> list[str]:
    if not recent["batches"]:
        return ["", "last batches: none recorded"]
    lines = ["", f"last batches (from {recent['source'].replace('_', ' ')})"]
    counts = recent["counts"]
    rows = [("batch", "at", *(_COUNT_HEADINGS[name] for name in counts), "ms")]
    for b in recent["batches"]:
        figures = ("-" if b[k] is None else str(b[k]) for k in (*counts, "duration_ms"))
        rows.append(
            (str(b["batch_id"]), "damaged" if b.get("damaged") else b["at"] or "-", *figures)
        )
    damaged = [
        f"  batch {b['batch_id']}: {b['damaged']}" for b in recent["batches"] if b.get("damaged")
    ]
    return (
        lines
        + _table(rows)
        + (["", "  manifests that could not be read:", *damaged] if damaged else [])
    )


def _table(rows: list[tuple[str, ...]], *, right_aligned: bool = True) -> list[str]:
    """`rows` (the first one the header) as indented lines of columns; with `right_aligned`,
    every column but the first is aligned right, as figures are."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [
        "  "
        + "  ".join(
            cell.rjust(w) if right_aligned and i > 0 else cell.ljust(w)
            for i, (cell, w) in enumerate(zip(row, widths, strict=True))
        ).rstrip()
        for row in rows
    ]


OVERDUE_ALERT_SECONDS = 60.0
"""How long past due a tier's records may wait before `status` warns (beyond one delay)."""


def overdue_tiers(tiers: list[Mapping[str, Any]]) -> list[str]:
    """A warning for each tier whose earliest record has been due for longer than its delay
    plus `OVERDUE_ALERT_SECONDS`: the job is not running, or something holds the tier up."""
    warnings = []
    for tier in tiers:
        due_in = tier["next_due_in_seconds"]
        if due_in is not None and -due_in > tier["delay_seconds"] + OVERDUE_ALERT_SECONDS:
            warnings.append(
                f"tier {tier['tier']} ({tier['delay']}) has records due for "
                f"{format_duration(round(-due_in) * 1000)} that the job has not taken: is the job "
                "running and keeping up? (`retrylib status --json` for the figures)"
            )
    return warnings


def stamped_ahead(entries: list[Mapping[str, Any]]) -> list[str]:
    """A warning for each tier or delay topic holding records stamped ahead of the clock."""
    return [
        f"{', '.join(entry['topics'])}: {entry['stamped_ahead']} record(s) with a Kafka "
        f"timestamp ahead of this clock, the first {entry['first_stamped_ahead']}: a "
        "producer's clock is off; the job reads them at once, and the records behind them "
        "as they fall due"
        for entry in entries
        if entry["stamped_ahead"]
    ]


def _ago(seconds: float | None) -> str:
    return "-" if seconds is None else f"{format_duration(max(0, round(seconds)) * 1000)} ago"


def _due(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds <= 0:
        return f"now (due {format_duration(round(-seconds) * 1000)} ago)"
    return f"in {format_duration(round(seconds) * 1000)}"


def status_json(status: Mapping[str, Any]) -> str:
    """`status` (from `collect_status`) as JSON for scripts."""
    return json.dumps(status, indent=2, default=str)


_SHOWN_ROWS = 20
"""The rows a dry run prints (of the records it would send); --json lists them all."""


def render_redrive(report: RedriveReport) -> str:
    """`report` (from `redrive`) as text for a terminal."""
    lines = []
    if report.dry_run:
        lines.append(
            f"dry run: {len(report.selected)} record(s) would be redriven; nothing was "
            "sent or changed"
        )
    elif report.selected:
        lines.append(f"redrive {report.redrive_id}: {len(report.selected)} record(s) sent")
    else:
        lines.append("nothing to redrive: no dead letter matches that was not redriven before")
    if report.dry_run and report.selected:
        classes = Counter(row["error_class"] or "-" for row in report.selected)
        lines.append(
            "by error class: "
            + ", ".join(f"{name} {count}" for name, count in sorted(classes.items()))
        )
    lines += _rows_table(report.selected[:_SHOWN_ROWS] if report.dry_run else report.selected)
    if report.dry_run and len(report.selected) > _SHOWN_ROWS:
        lines.append(f"... and {len(report.selected) - _SHOWN_ROWS} more (--json lists them all)")
    if report.looping:
        lines.append(
            f"{report.looping} matching record(s) came back after being redriven "
            "dead_letter.max_redrives times: left out (--again sends them too)"
        )
    if report.left:
        verb = "would be left" if report.dry_run else "are left"
        lines.append(
            f"{report.left} more record(s) match but {verb} for the next run (--limit or --rate)"
        )
    if report.resumed:
        verb = "would be resent" if report.dry_run else "resent"
        lines.append(f"{len(report.resumed)} record(s) of an interrupted redrive {verb}:")
        lines += _rows_table(report.resumed)
    if report.confirmed:
        verb = "would be marked" if report.dry_run else "marked"
        lines.append(
            f"{len(report.confirmed)} record(s) sent by an interrupted redrive {verb} as "
            "redriven (not sent again):"
        )
        lines += _rows_table(report.confirmed)
    return "\n".join(lines)


def _rows_table(rows: list[dict[str, Any]]) -> list[str]:
    if not rows:
        return []
    table = [("id", "dead lettered at", "error class", "origin", "to")]
    for row in rows:
        at = row["dead_lettered_at"]
        table.append(
            (
                row["id"],
                at.isoformat(timespec="seconds") if at is not None else "-",
                row["error_class"] or "-",
                f"{row['origin_topic']}[{row['origin_partition']}]@{row['origin_offset']}",
                row["redrive_topic"] or "-",
            )
        )
    return _table(table, right_aligned=False)


class ProgressLine:
    """Shows (done, total) on stderr: rewritten in place on a terminal, else a line every
    few seconds and at the end.
    """

    def __init__(self, label: str, stream: TextIO | None = None, every: float = 5.0) -> None:
        self.label = label
        self.stream = stream or sys.stderr
        self.every = every
        self._last = 0.0
        self._shown = False

    def __call__(self, done: int, total: int) -> None:
        now = time.monotonic()
        text = f"{self.label} {done}/{total}"
        if self.stream.isatty():
            self.stream.write(f"\r{text}")
            self.stream.flush()
            self._shown = True
        elif done == total or now - self._last >= self.every:
            self.stream.write(text + "\n")
            self._last = now

    def close(self) -> None:
        if self._shown:
            self.stream.write("\n")


def redrive_json(report: RedriveReport) -> str:
    """`report` (from `redrive`) as JSON for scripts, times in ISO 8601."""

    def rows(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [{k: _plain(v) for k, v in row.items()} for row in items]

    return json.dumps(
        {
            "dry_run": report.dry_run,
            "redrive_id": report.redrive_id,
            "sent": report.sent,
            "left": report.left,
            "looping": report.looping,
            "selected": rows(report.selected),
            "resumed": rows(report.resumed),
            "confirmed": rows(report.confirmed),
        },
        indent=2,
        default=str,
    )


def _plain(value: Any) -> Any:
    return value.isoformat() if isinstance(value, datetime) else value
