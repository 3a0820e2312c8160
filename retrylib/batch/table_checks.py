"""Whether the tables a job appends to agree with its checkpoint, checked once per run.

Each append of a batch carries the batch id as the table's app transaction version for the
checkpoint's app id (`sinks.tables.append_once`), and the batch's manifest counts the rows
it appends (`rows`) and names the table they go to (`tables`). So at the first batch of a
run, `batch_id`, a table must hold:

- no batch after `batch_id` (Spark replays at most the last unfinished batch): else the
  checkpoint is older than the table, and its batches would be skipped as committed;
- every batch before `batch_id` whose manifest appended rows to it: else the table is older
  than the checkpoint (restored from a backup, its latest commits removed) and the next
  append would silently take the place of the rows it lost.

Pure: the caller reads the tables and the manifests.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from retrylib.config.table_ref import TableRef

_TABLE_NAMES = {"output": "output", "dead_letter": "dead-letter"}


@dataclass(frozen=True)
class TableState:
    """A table the batch appends rows of `kind` ("output", "dead_letter") to, and the last
    batch it holds of the job's app id (`committed`; None for none)."""

    kind: str
    table: TableRef
    committed: int | None


def manifest_tables(tables: Mapping[str, TableRef | None]) -> dict[str, str]:
    """What a manifest keeps of the tables its batch appends to: kind -> resolved name."""
    return {kind: table.resolved().text for kind, table in tables.items() if table is not None}


def last_appends(
    manifests: Iterable[tuple[int, Mapping[str, Any]]], tables: Mapping[str, TableRef]
) -> dict[str, int]:
    """kind -> the last batch among `manifests` ((batch id, manifest), newest first) that
    appended rows of that kind to the table configured now for it. Stops taking manifests
    once every kind has one. A manifest that does not name its tables (written by retrylib
    before it did) says nothing."""
    found: dict[str, int] = {}
    for batch_id, manifest in manifests:
        named = manifest.get("tables") or {}
        rows = manifest.get("rows") or {}
        for kind, table in tables.items():
            if kind not in found and rows.get(kind) and named.get(kind) == table.resolved().text:
                found[kind] = batch_id
        if len(found) == len(tables):
            break
    return found


def mismatch(state: TableState, app_id: str, batch_id: int, last_append: int | None) -> str | None:
    """The one-line error when `state`'s table is ahead of or behind the checkpoint whose run
    starts at `batch_id`, else None. `last_append`: the last batch before `batch_id` whose
    manifest appended rows to it."""
    name = f"the {_TABLE_NAMES[state.kind]} table {state.table}"
    done = state.committed
    if done is not None and done > batch_id:
        return (
            f"{name} holds batch {done} of {app_id!r}, but the query is at batch {batch_id}: "
            "the checkpoint is older than the table. Its batches would be skipped as already "
            "committed. Restore the latest checkpoint, or start from a new one"
        )
    if last_append is not None and (done is None or done < last_append):
        holds = "no batch" if done is None else f"batches up to {done}"
        return (
            f"{name} holds {holds} of {app_id!r}, but batch {last_append} of the checkpoint "
            "appended rows to it: the table is older than the checkpoint (restored from a "
            "backup, or its latest commits removed?), and the next batch would take the place "
            "of what it lost. Restore the table's latest version, or start from a new "
            "checkpoint with kafka.starting_offsets where the table's rows end"
        )
    return None
