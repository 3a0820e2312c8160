"""Table references and schema checks of `retrylib.sinks.tables`: pure, no Spark session."""

from __future__ import annotations

import os

import pytest
from pyspark.sql.types import (
    ArrayType,
    DataType,
    DoubleType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
)

from retrylib.config.table_ref import TableRef
from retrylib.errors import ConfigError
from retrylib.sinks.tables import column_differences

KEY = "output.table"


@pytest.mark.parametrize(
    "text",
    [
        "s3://bucket/tables/orders",
        "s3a://bucket/orders",
        "abfss://container@account.dfs.core.windows.net/orders",
        "gs://bucket/orders",
        "dbfs:/mnt/orders",
        "file:///tmp/orders",
        "/Volumes/cat/sch/vol/orders",
        "/tmp/orders",
        "./orders",
        "../orders",
        "tables/orders",
        "/tmp/my tables/orders",
    ],
)
def test_paths_and_uris_are_paths(text: str) -> None:
    ref = TableRef.parse(text, KEY)
    assert ref == TableRef(text, is_path=True)
    assert str(ref) == text


@pytest.mark.parametrize(
    "text",
    [
        "db.orders",
        "main.sales.orders",
        "`my-cat`.db.orders",
        "`my-cat`.`my db`.`orders.v2`",
        "db.`we``ird`",
        "DB_1.Orders_2024",
        "spark_catalog.default.orders",
        "db.2024_orders",
    ],
)
def test_two_or_three_identifiers_are_catalog_names(text: str) -> None:
    ref = TableRef.parse(text, KEY)
    assert ref == TableRef(text, is_path=False)
    assert str(ref) == text


@pytest.mark.parametrize(
    ("text", "match"),
    [
        (
            "orders",
            r"output\.table: 'orders' is ambiguous.*write \./orders for a folder, "
            r"or db\.orders for a catalog table",
        ),
        ("`orders`", r"output\.table: '`orders`' is ambiguous.*write \./orders for a folder"),
        ("", r"output\.table: '' is empty; write \./orders for a folder, or db\.orders"),
        ("  ", r"output\.table: '  ' is empty"),
        (
            " db.orders",
            r"output\.table: ' db\.orders' has spaces around it; write 'db\.orders' without them",
        ),
        ("./orders ", r"has spaces around it; write '\./orders' without them"),
        (
            "a.b.c.d",
            r"output\.table: 'a\.b\.c\.d' has 4 dot-separated parts.*2 \(db\.table\) "
            r"or 3 \(catalog\.db\.table\); write \./orders for a folder",
        ),
        (
            "db.my orders",
            r"output\.table: 'db\.my orders' is neither a path nor a catalog "
            r"table name \(unexpected ' ' at position 5.*backquote",
        ),
        ("my-cat.db.orders", r"unexpected '-' at position 2.*`my-cat`\.db\.t"),
        ("db..orders", r"unexpected '\.' at position 3"),
        ("db.", r"unexpected end at position 3"),
        (".orders", r"unexpected '\.' at position 0"),
        ("`db.orders", r"the backquote at position 0 is not closed"),
        ("db.``", r"the backquoted part at position 3 is empty"),
        ("`db`x.orders", r"expected '\.' after `db` at position 4, found 'x'"),
    ],
)
def test_other_texts_are_refused_with_key_value_and_fix(text: str, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        TableRef.parse(text, KEY)


def test_a_value_that_is_not_a_string_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"output\.table: expected .* string, got 5"):
        TableRef.parse(5, KEY)  # type: ignore[arg-type]


def test_resolved_makes_only_relative_local_paths_absolute() -> None:
    assert TableRef.parse("./orders", KEY).resolved() == TableRef(
        os.path.join(os.getcwd(), "orders"), is_path=True
    )
    assert TableRef.parse("tables/orders", KEY).resolved().text == os.path.join(
        os.getcwd(), "tables", "orders"
    )
    for text in ("/tmp/orders", "s3://b/orders", "dbfs:/orders", "db.orders", "c.db.orders"):
        ref = TableRef.parse(text, KEY)
        assert ref.resolved() is ref


def _schema(*fields: tuple[str, DataType, bool]) -> StructType:
    return StructType([StructField(name, type_, nullable) for name, type_, nullable in fields])


TABLE = _schema(("id", LongType(), True), ("total", DoubleType(), True))


def test_equal_schemas_fit_whatever_the_nullability_and_case() -> None:
    config = _schema(("ID", LongType(), False), ("Total", DoubleType(), False))
    assert column_differences(TABLE, config) == ""
    nested_table = _schema(("tags", ArrayType(StringType(), True), True))
    nested_config = _schema(("tags", ArrayType(StringType(), False), False))
    assert column_differences(nested_table, nested_config) == ""


def test_every_difference_is_named() -> None:
    config = _schema(
        ("id", IntegerType(), True), ("total", StringType(), True), ("note", StringType(), True)
    )
    table = _schema(
        ("id", LongType(), True), ("total", DoubleType(), True), ("old", IntegerType(), True)
    )
    assert column_differences(table, config) == (
        "differs from the config: "
        "missing columns (in the config, not in the table): note STRING; "
        "extra columns (in the table, not in the config): old INT; "
        "column id: table has BIGINT, config has INT; "
        "column total: table has DOUBLE, config has STRING"
    )


def test_evolve_accepts_new_columns_only() -> None:
    wider = _schema(
        ("id", LongType(), True), ("total", DoubleType(), True), ("note", StringType(), True)
    )
    assert column_differences(TABLE, wider, evolve=True) == ""
    retyped = _schema(
        ("id", LongType(), True), ("total", StringType(), True), ("note", StringType(), True)
    )
    assert column_differences(TABLE, retyped, evolve=True) == (
        "differs from the config: column total: table has DOUBLE, config has STRING"
    )
    fewer = _schema(("id", LongType(), True))
    assert column_differences(TABLE, fewer, evolve=True) == (
        "differs from the config: extra columns (in the table, not in the config): total DOUBLE"
    )


def test_nested_types_are_written_as_sql() -> None:
    table = _schema(("payload", StructType([StructField("a", IntegerType())]), True))
    config = _schema(
        ("payload", ArrayType(StringType()), True),
        ("tags", MapType(StringType(), LongType()), True),
    )
    assert column_differences(table, config, evolve=True) == (
        "differs from the config: column payload: table has STRUCT<a: INT>, config has "
        "ARRAY<STRING>"
    )
    assert "tags MAP<STRING, BIGINT>" in column_differences(table, config)
