"""How `retrylib redrive` picks dead letters: the selection's SQL on a real Delta table."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pyarrow as pa
import pytest
from deltalake import DeltaTable, QueryBuilder, write_deltalake

from retrylib.dead_letter import DEAD_LETTER_SCHEMA, ensure_dead_letter_table
from retrylib.redrive import Selection

NOW = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)


@pytest.fixture
def table(tmp_path) -> DeltaTable:
    rows = [
        ("a", "builtins.ValueError", NOW - timedelta(hours=3), None),
        ("b", "builtins.ValueError", NOW - timedelta(hours=1), None),
        ("c", "shop.errors.PriceError", NOW - timedelta(minutes=5), None),
        ("d", "builtins.KeyError", NOW, "earlier-redrive"),
        ("it's", "shop.NotAValueError", NOW, None),
    ]
    data = pa.Table.from_pylist(
        [
            {"id": i, "error_class": c, "dead_lettered_at": at, "redrive_id": r}
            for i, c, at, r in rows
        ],
        schema=DEAD_LETTER_SCHEMA,
    )
    uri = str(tmp_path / "dlq")
    ensure_dead_letter_table(uri)
    write_deltalake(uri, data, mode="append")
    return DeltaTable(uri)


def chosen(table: DeltaTable, selection: Selection) -> list[str]:
    sql = f"SELECT id FROM t WHERE {selection.predicate()} ORDER BY id"
    result = pa.table(QueryBuilder().register("t", table).execute(sql).read_all())
    return [str(v) for v in result.column(0).to_pylist()]


def test_no_filter_picks_every_row_not_claimed(table):
    assert chosen(table, Selection()) == ["a", "b", "c", "it's"]


def test_time_range_is_half_open(table):
    selection = Selection(since=NOW - timedelta(hours=1), until=NOW)

    assert chosen(table, selection) == ["b", "c"]


def test_naive_times_are_utc(table):
    naive = (NOW - timedelta(hours=2)).replace(tzinfo=None)

    assert chosen(table, Selection(until=naive)) == ["a"]


def test_error_class_matches_the_full_or_the_short_name(table):
    assert chosen(table, Selection(error_classes=("ValueError",))) == ["a", "b"]
    assert chosen(table, Selection(error_classes=("shop.errors.PriceError", "KeyError"))) == ["c"]


def test_ids_are_quoted(table):
    assert chosen(table, Selection(ids=("it's", "a"))) == ["a", "it's"]


def test_the_predicate_drives_a_delta_update(table):
    table.update(
        predicate=Selection(error_classes=("ValueError",)).predicate(),
        updates={"redrive_id": "'r1'", "redrive_topic": "origin_topic"},
    )

    assert chosen(table, Selection()) == ["c", "it's"]


def test_an_old_table_gets_the_redrive_columns(tmp_path):
    uri = str(tmp_path / "old")
    old = pa.schema([f for f in DEAD_LETTER_SCHEMA if not f.name.startswith("redrive")])
    DeltaTable.create(uri, schema=old)

    ensure_dead_letter_table(uri)

    assert pa.schema(DeltaTable(uri).schema().to_arrow()).names == DEAD_LETTER_SCHEMA.names
