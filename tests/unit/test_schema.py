"""The output schema: Spark DDL parsed in pure Python, converted to Arrow and to pyspark."""

from __future__ import annotations

import pyarrow as pa
import pytest
from pyspark.sql import types as st

from retrylib.config.schema import OutputSchema, parse_schema
from retrylib.kafka.arrow_records import utc_arrow_schema

# (DDL type, normalized DDL, Arrow type, Spark type)
ATOMIC_CASES = [
    ("STRING", "STRING", pa.string(), st.StringType()),
    ("varchar(20)", "STRING", pa.string(), st.StringType()),
    ("CHAR(1)", "STRING", pa.string(), st.StringType()),
    ("boolean", "BOOLEAN", pa.bool_(), st.BooleanType()),
    ("TINYINT", "TINYINT", pa.int8(), st.ByteType()),
    ("byte", "TINYINT", pa.int8(), st.ByteType()),
    ("SMALLINT", "SMALLINT", pa.int16(), st.ShortType()),
    ("Short", "SMALLINT", pa.int16(), st.ShortType()),
    ("INT", "INT", pa.int32(), st.IntegerType()),
    ("integer", "INT", pa.int32(), st.IntegerType()),
    ("BIGINT", "BIGINT", pa.int64(), st.LongType()),
    ("long", "BIGINT", pa.int64(), st.LongType()),
    ("FLOAT", "FLOAT", pa.float32(), st.FloatType()),
    ("real", "FLOAT", pa.float32(), st.FloatType()),
    ("DOUBLE", "DOUBLE", pa.float64(), st.DoubleType()),
    ("DECIMAL", "DECIMAL(10,0)", pa.decimal128(10, 0), st.DecimalType(10, 0)),
    ("decimal(12, 2)", "DECIMAL(12,2)", pa.decimal128(12, 2), st.DecimalType(12, 2)),
    ("DEC(5)", "DECIMAL(5,0)", pa.decimal128(5, 0), st.DecimalType(5, 0)),
    ("NUMERIC(38,38)", "DECIMAL(38,38)", pa.decimal128(38, 38), st.DecimalType(38, 38)),
    ("DATE", "DATE", pa.date32(), st.DateType()),
    ("TIMESTAMP", "TIMESTAMP", pa.timestamp("us", tz="UTC"), st.TimestampType()),
    ("timestamp_ltz", "TIMESTAMP", pa.timestamp("us", tz="UTC"), st.TimestampType()),
    ("TIMESTAMP_NTZ", "TIMESTAMP_NTZ", pa.timestamp("us"), st.TimestampNTZType()),
    ("BINARY", "BINARY", pa.binary(), st.BinaryType()),
]


@pytest.mark.parametrize(("ddl_type", "normalized", "arrow", "spark"), ATOMIC_CASES)
def test_atomic_types(
    ddl_type: str, normalized: str, arrow: pa.DataType, spark: st.DataType
) -> None:
    schema = parse_schema(f"c {ddl_type}")
    assert schema.ddl == f"c {normalized}"
    assert schema.names == ("c",)
    assert schema.to_arrow() == pa.schema([pa.field("c", arrow)])
    assert schema.to_spark() == st.StructType([st.StructField("c", spark, True)])


def test_order_schema() -> None:
    schema = parse_schema("order_id STRING, customer STRING, total DOUBLE, currency STRING")
    assert schema.names == ("order_id", "customer", "total", "currency")
    assert schema.ddl == "order_id STRING, customer STRING, total DOUBLE, currency STRING"
    assert schema.to_arrow().field("total").type == pa.float64()


def test_nested_types() -> None:
    schema = parse_schema(
        "tags ARRAY<STRING>, attrs map<string, array<int>>, "
        "line STRUCT<sku: STRING NOT NULL, qty INT COMMENT 'units', at TIMESTAMP>"
    )
    assert schema.ddl == (
        "tags ARRAY<STRING>, attrs MAP<STRING, ARRAY<INT>>, "
        "line STRUCT<sku: STRING NOT NULL, qty: INT COMMENT 'units', at: TIMESTAMP>"
    )
    assert schema.to_arrow() == pa.schema(
        [
            pa.field("tags", pa.list_(pa.field("element", pa.string()))),
            pa.field(
                "attrs",
                pa.map_(
                    pa.field("key", pa.string(), nullable=False),
                    pa.field("value", pa.list_(pa.field("element", pa.int32()))),
                ),
            ),
            pa.field(
                "line",
                pa.struct(
                    [
                        pa.field("sku", pa.string(), nullable=False),
                        pa.field("qty", pa.int32()),
                        pa.field("at", pa.timestamp("us", tz="UTC")),
                    ]
                ),
            ),
        ]
    )
    assert schema.to_spark() == st.StructType(
        [
            st.StructField("tags", st.ArrayType(st.StringType(), True)),
            st.StructField(
                "attrs",
                st.MapType(st.StringType(), st.ArrayType(st.IntegerType(), True), True),
            ),
            st.StructField(
                "line",
                st.StructType(
                    [
                        st.StructField("sku", st.StringType(), False),
                        st.StructField("qty", st.IntegerType(), True, {"comment": "units"}),
                        st.StructField("at", st.TimestampType(), True),
                    ]
                ),
            ),
        ]
    )


def test_not_null_and_comment_on_columns() -> None:
    schema = parse_schema("id BIGINT NOT NULL COMMENT \"the id\", note STRING COMMENT 'it\\'s'")
    assert schema.ddl == "id BIGINT NOT NULL COMMENT 'the id', note STRING COMMENT 'it\\'s'"
    assert not schema.to_arrow().field("id").nullable
    assert schema.to_arrow().field("note").nullable
    assert schema.to_spark()["id"] == st.StructField(
        "id", st.LongType(), False, {"comment": "the id"}
    )
    assert schema.to_spark()["note"].metadata == {"comment": "it's"}


def test_backquoted_names_keep_their_text() -> None:
    schema = parse_schema("`order id` STRING, `we``ird` INT, `select` DOUBLE")
    assert schema.names == ("order id", "we`ird", "select")
    assert schema.ddl == "`order id` STRING, `we``ird` INT, select DOUBLE"


def test_keywords_case_insensitive_names_keep_case() -> None:
    schema = parse_schema("OrderId string not null, Total Double")
    assert schema.ddl == "OrderId STRING NOT NULL, Total DOUBLE"
    assert schema.names == ("OrderId", "Total")


def test_normalized_ddl_parses_to_the_same_schema() -> None:
    schema = parse_schema(
        "`a b` decimal(7,3) not null comment 'x\\'y', m map<string, struct<`c d`: date>>"
    )
    assert parse_schema(schema.ddl) == schema


def test_to_arrow_matches_pyspark_conversion() -> None:
    schema = parse_schema(
        "a STRING NOT NULL, b DECIMAL(9,2), c ARRAY<STRUCT<x: INT NOT NULL, y: TIMESTAMP_NTZ>>, "
        "d MAP<STRING, DOUBLE>, e TIMESTAMP, f DATE, g BINARY, h BOOLEAN, i TINYINT"
    )
    assert schema.to_arrow() == utc_arrow_schema(schema.to_spark())


def test_output_schema_is_frozen_and_hashable() -> None:
    schema = parse_schema("a INT")
    assert isinstance(schema, OutputSchema)
    assert hash(schema) == hash(parse_schema("a   int"))
    with pytest.raises(AttributeError):
        schema.ddl = "b INT"  # type: ignore[misc]


@pytest.mark.parametrize(
    ("ddl", "message"),
    [
        ("", "schema is empty"),
        ("   ", "schema is empty"),
        ("a", "expected a type .*, got end of input"),
        ("a STRNG", "expected a type .*, got 'STRNG' at position 2"),
        ("a INT,", "expected a field name, got end of input"),
        (", a INT", "expected a field name, got ',' at position 0"),
        ("a INT b INT", "expected ',' or end of input, got 'b' at position 6"),
        ("a ARRAY<INT", "expected '>' closing ARRAY<, got end of input"),
        ("a ARRAY INT", "expected '<' after ARRAY, got 'INT' at position 8"),
        ("a MAP<INT>", "expected ',' between MAP key and value types, got '>' at position 9"),
        ("a STRUCT<>", "expected a field name, got '>' at position 9"),
        ("a STRUCT<x INT", "expected ',' or '>', got end of input"),
        ("a ARRAY<INT>>", "expected ',' or end of input, got '>' at position 12"),
        ("a INT, A STRING", "duplicate name 'A'"),
        ("a STRUCT<x INT, X INT>", "duplicate name 'X'"),
        ("a DECIMAL(39,2)", r"DECIMAL\(39,2\) at position 2: precision must be 1 to 38"),
        ("a DECIMAL(5,6)", r"DECIMAL\(5,6\) at position 2: .*scale 0 to the precision"),
        ("a DECIMAL(0)", r"DECIMAL\(0,0\) at position 2"),
        ("a DECIMAL(1,2,3)", r"DECIMAL at position 2: write it like DECIMAL\(10,2\), got 3"),
        ("a DECIMAL(x)", "expected a whole number, got 'x' at position 10"),
        ("a DECIMAL(5", "expected '\\)', got end of input"),
        ("a VARCHAR", r"VARCHAR at position 2: write it like VARCHAR\(20\), got 0"),
        ("a INT NOT", "expected NULL, got end of input"),
        ("a INT NOT NUL", "expected NULL, got 'NUL' at position 10"),
        ("a INT COMMENT x", "expected a quoted comment after COMMENT, got 'x' at position 14"),
        ("a INT COMMENT 'open", 'unexpected character "\'" at position 14'),
        ("a INT; DROP", "unexpected character ';' at position 5"),
        ("`` INT", "expected a field name, got '``' at position 1"),
        ("`a INT", "unexpected character '`' at position 0"),
    ],
)
def test_errors_say_where_and_what_was_expected(ddl: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_schema(ddl)
