"""The handler's output schema: a subset of Spark DDL, parsed in pure Python (no JVM).

`parse_schema("order_id STRING NOT NULL, total DECIMAL(10,2)")` gives an `OutputSchema` that
converts to a `pyarrow.Schema` (what executors write) and to a pyspark `StructType` (what the
driver declares; pyspark is imported only then, so reading a config needs no Spark).
Supported types: STRING, VARCHAR(n), CHAR(n), BOOLEAN, TINYINT/BYTE, SMALLINT/SHORT,
INT/INTEGER, BIGINT/LONG, FLOAT/REAL, DOUBLE, DECIMAL/DEC/NUMERIC[(p[,s])], DATE, TIMESTAMP
(TIMESTAMP_LTZ), TIMESTAMP_NTZ, BINARY, ARRAY<T>, MAP<K, V> and STRUCT<name[:] T, ...>;
columns and struct fields may add NOT NULL and COMMENT 'text'. Keywords are case-insensitive;
names keep their case and may be `backquoted`.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING

import pyarrow as pa

if TYPE_CHECKING:
    from pyspark.sql import types as st

_DEFAULT_DECIMAL = (10, 0)
_MAX_DECIMAL_PRECISION = 38

# Normalized name -> (arrow type, name of the spark type class), for types without parameters
# or children.
_ATOMIC: dict[str, tuple[Callable[[], pa.DataType], str]] = {
    "STRING": (pa.string, "StringType"),
    "BOOLEAN": (pa.bool_, "BooleanType"),
    "TINYINT": (pa.int8, "ByteType"),
    "SMALLINT": (pa.int16, "ShortType"),
    "INT": (pa.int32, "IntegerType"),
    "BIGINT": (pa.int64, "LongType"),
    "FLOAT": (pa.float32, "FloatType"),
    "DOUBLE": (pa.float64, "DoubleType"),
    "DATE": (pa.date32, "DateType"),
    "TIMESTAMP": (lambda: pa.timestamp("us", tz="UTC"), "TimestampType"),
    "TIMESTAMP_NTZ": (lambda: pa.timestamp("us"), "TimestampNTZType"),
    "BINARY": (pa.binary, "BinaryType"),
}
_ALIASES = {
    "BYTE": "TINYINT",
    "SHORT": "SMALLINT",
    "INTEGER": "INT",
    "LONG": "BIGINT",
    "REAL": "FLOAT",
    "TIMESTAMP_LTZ": "TIMESTAMP",
    "DEC": "DECIMAL",
    "NUMERIC": "DECIMAL",
}
_TYPE_NAMES = ", ".join([*_ATOMIC, "VARCHAR(n)", "DECIMAL(p,s)", "ARRAY<T>", "MAP<K,V>", "STRUCT"])
_PLAIN_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_TOKEN = re.compile(
    r"""\s*(?:
        (?P<word>[A-Za-z0-9_]+)
      | `(?P<quoted>(?:[^`]|``)*)`
      | (?P<string>'(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*")
      | (?P<punct>[<>(),:])
    )""",
    re.VERBOSE | re.DOTALL,
)
_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "0": "\0"}


@dataclass(frozen=True)
class AtomicType:
    """A type without parameters or children, by its normalized name (e.g. "INT")."""

    name: str

    def ddl(self) -> str:
        return self.name

    def to_arrow(self) -> pa.DataType:
        return _ATOMIC[self.name][0]()

    def to_spark(self) -> st.DataType:
        return getattr(_spark_types(), _ATOMIC[self.name][1])()


@dataclass(frozen=True)
class DecimalType:
    """DECIMAL(precision, scale)."""

    precision: int
    scale: int

    def ddl(self) -> str:
        return f"DECIMAL({self.precision},{self.scale})"

    def to_arrow(self) -> pa.DataType:
        return pa.decimal128(self.precision, self.scale)

    def to_spark(self) -> st.DataType:
        return _spark_types().DecimalType(self.precision, self.scale)


@dataclass(frozen=True)
class ArrayType:
    """ARRAY<element>; elements may be null, as in Spark."""

    element: DataType

    def ddl(self) -> str:
        return f"ARRAY<{self.element.ddl()}>"

    def to_arrow(self) -> pa.DataType:
        return pa.list_(pa.field("element", self.element.to_arrow(), nullable=True))

    def to_spark(self) -> st.DataType:
        return _spark_types().ArrayType(self.element.to_spark(), containsNull=True)


@dataclass(frozen=True)
class MapType:
    """MAP<key, value>; keys are never null, values may be, as in Spark."""

    key: DataType
    value: DataType

    def ddl(self) -> str:
        return f"MAP<{self.key.ddl()}, {self.value.ddl()}>"

    def to_arrow(self) -> pa.DataType:
        return pa.map_(
            pa.field("key", self.key.to_arrow(), nullable=False),
            pa.field("value", self.value.to_arrow(), nullable=True),
        )

    def to_spark(self) -> st.DataType:
        return _spark_types().MapType(
            self.key.to_spark(), self.value.to_spark(), valueContainsNull=True
        )


@dataclass(frozen=True)
class Field:
    """A column, or a field of a STRUCT."""

    name: str
    type: DataType
    nullable: bool = True
    comment: str | None = None

    def ddl(self, separator: str = " ") -> str:
        """`name TYPE [NOT NULL] [COMMENT '...']`; STRUCT fields use ": " as `separator`."""
        name = self.name if _PLAIN_NAME.fullmatch(self.name) else _backquote(self.name)
        text = f"{name}{separator}{self.type.ddl()}"
        if not self.nullable:
            text += " NOT NULL"
        if self.comment is not None:
            text += f" COMMENT {_single_quote(self.comment)}"
        return text

    def to_arrow(self) -> pa.Field:
        return pa.field(self.name, self.type.to_arrow(), nullable=self.nullable)

    def to_spark(self) -> st.StructField:
        metadata = {} if self.comment is None else {"comment": self.comment}
        return _spark_types().StructField(self.name, self.type.to_spark(), self.nullable, metadata)


@dataclass(frozen=True)
class StructType:
    """STRUCT<field, ...>, with at least one field and no two names equal ignoring case."""

    fields: tuple[Field, ...]

    def ddl(self) -> str:
        return f"STRUCT<{', '.join(f.ddl(': ') for f in self.fields)}>"

    def to_arrow(self) -> pa.DataType:
        return pa.struct([f.to_arrow() for f in self.fields])

    def to_spark(self) -> st.DataType:
        return _spark_types().StructType([f.to_spark() for f in self.fields])


DataType = AtomicType | DecimalType | ArrayType | MapType | StructType


@dataclass(frozen=True)
class OutputSchema:
    """The columns a handler returns: normalized DDL, names, and the same as Arrow or Spark."""

    ddl: str
    names: tuple[str, ...]
    fields: tuple[Field, ...]

    def to_arrow(self) -> pa.Schema:
        """The Arrow schema: TIMESTAMP as UTC microseconds, TIMESTAMP_NTZ without a zone.

        Equal to pyspark's conversion of `to_spark()` with timestamps in UTC
        (`kafka.arrow_records.utc_arrow_schema`), except that comments are not carried as Arrow
        field metadata.
        """
        return pa.schema([f.to_arrow() for f in self.fields])

    def to_spark(self) -> st.StructType:
        """The pyspark schema; built in Python, so no SparkSession is needed."""
        return _spark_types().StructType([f.to_spark() for f in self.fields])


def _spark_types() -> ModuleType:
    """pyspark's types module, imported on first use."""
    from pyspark.sql import types

    return types


def parse_schema(ddl: str) -> OutputSchema:
    """Parse Spark DDL such as "order_id STRING, total DOUBLE NOT NULL" into an `OutputSchema`.

    Raises `ValueError` saying where (character position) and what was expected when the text
    is empty, a type is unknown, a bracket or comma is missing, a DECIMAL is out of range, or
    two columns (or two fields of one STRUCT) share a name ignoring case, as Spark does.
    """
    parser = _Parser(ddl)
    fields = parser.fields(end=None)
    return OutputSchema(
        ddl=", ".join(f.ddl() for f in fields),
        names=tuple(f.name for f in fields),
        fields=fields,
    )


@dataclass(frozen=True)
class _Token:
    kind: str  # "word", "quoted", "string", "punct" or "end"
    text: str  # as written; for "quoted" and "string", the unescaped content
    position: int

    def describe(self) -> str:
        """The token as an error message shows it: "'STRNG' at position 9" or "end of input"."""
        if self.kind == "end":
            return "end of input"
        shown = _backquote(self.text) if self.kind == "quoted" else self.text
        return f"{shown!r} at position {self.position}"


class _Parser:
    """Recursive descent over the token list; every method consumes what it parses."""

    def __init__(self, text: str) -> None:
        self.tokens = _tokenize(text)
        self.index = 0

    def fields(self, end: str | None) -> tuple[Field, ...]:
        """Comma-separated fields up to `end` (">" inside STRUCT, None for the whole text)."""
        if self.peek().kind == "end" and end is None:
            raise ValueError('schema is empty: write columns like "order_id STRING, total DOUBLE"')
        fields = [self.field()]
        while self.accept(","):
            fields.append(self.field())
        if end is not None:
            self.expect(end, f"',' or {end!r}")
        elif self.peek().kind != "end":
            raise ValueError(f"expected ',' or end of input, got {self.peek().describe()}")
        seen: set[str] = set()
        for f in fields:
            if f.name.lower() in seen:
                raise ValueError(f"duplicate name {f.name!r}: names must differ ignoring case")
            seen.add(f.name.lower())
        return tuple(fields)

    def field(self) -> Field:
        token = self.take()
        if token.kind not in ("word", "quoted") or not token.text:
            raise ValueError(f"expected a field name, got {token.describe()}")
        self.accept(":")
        data_type = self.data_type()
        nullable = not self.accept_word("NOT")
        if not nullable:
            self.expect_word("NULL")
        comment = None
        if self.accept_word("COMMENT"):
            quoted = self.take()
            if quoted.kind != "string":
                raise ValueError(
                    f"expected a quoted comment after COMMENT, got {quoted.describe()}"
                )
            comment = quoted.text
        return Field(token.text, data_type, nullable, comment)

    def data_type(self) -> DataType:
        token = self.take()
        name = _ALIASES.get(token.text.upper(), token.text.upper()) if token.kind == "word" else ""
        if name in _ATOMIC:
            return AtomicType(name)
        if name in ("VARCHAR", "CHAR"):
            self.parameters(token, 1, 1, "VARCHAR(20)")
            return AtomicType("STRING")
        if name == "DECIMAL":
            return _decimal(token, self.parameters(token, 0, 2, "DECIMAL(10,2)"))
        if name == "ARRAY":
            self.expect("<", "'<' after ARRAY")
            element = self.data_type()
            self.expect(">", "'>' closing ARRAY<")
            return ArrayType(element)
        if name == "MAP":
            self.expect("<", "'<' after MAP")
            key = self.data_type()
            self.expect(",", "',' between MAP key and value types")
            value = self.data_type()
            self.expect(">", "'>' closing MAP<")
            return MapType(key, value)
        if name == "STRUCT":
            self.expect("<", "'<' after STRUCT")
            return StructType(self.fields(end=">"))
        raise ValueError(f"expected a type ({_TYPE_NAMES}), got {token.describe()}")

    def parameters(self, type_token: _Token, least: int, most: int, example: str) -> list[int]:
        """An optional "(n, ...)" after a type name, with `least` to `most` whole numbers."""
        values: list[int] = []
        if self.accept("("):
            values.append(self.integer())
            while self.accept(","):
                values.append(self.integer())
            self.expect(")", "')'")
        if not least <= len(values) <= most:
            raise ValueError(
                f"{type_token.text.upper()} at position {type_token.position}: write it like "
                f"{example}, got {len(values)} numbers in parentheses"
            )
        return values

    def integer(self) -> int:
        token = self.take()
        if token.kind != "word" or not token.text.isdigit():
            raise ValueError(f"expected a whole number, got {token.describe()}")
        return int(token.text)

    def peek(self) -> _Token:
        return self.tokens[self.index]

    def take(self) -> _Token:
        token = self.tokens[self.index]
        self.index = min(self.index + 1, len(self.tokens) - 1)
        return token

    def accept(self, punct: str) -> bool:
        if self.peek().kind == "punct" and self.peek().text == punct:
            self.take()
            return True
        return False

    def accept_word(self, word: str) -> bool:
        if self.peek().kind == "word" and self.peek().text.upper() == word:
            self.take()
            return True
        return False

    def expect(self, punct: str, what: str) -> None:
        if not self.accept(punct):
            raise ValueError(f"expected {what}, got {self.peek().describe()}")

    def expect_word(self, word: str) -> None:
        if not self.accept_word(word):
            raise ValueError(f"expected {word}, got {self.peek().describe()}")


def _tokenize(text: str) -> list[_Token]:
    """Split `text` into tokens, then an "end" token; raises ValueError on a stray character."""
    tokens = []
    position = 0
    while text[position:].strip():
        match = _TOKEN.match(text, position)
        if match is None:
            start = len(text) - len(text[position:].lstrip())
            raise ValueError(f"unexpected character {text[start]!r} at position {start}")
        kind = match.lastgroup or ""
        content = match.group(kind)
        if kind == "quoted":
            content = content.replace("``", "`")
        elif kind == "string":
            content = _unescape(content)
        tokens.append(_Token(kind, content, match.start(kind)))
        position = match.end()
    tokens.append(_Token("end", "", len(text)))
    return tokens


def _decimal(token: _Token, values: list[int]) -> DecimalType:
    precision, scale = (values + [0])[:2] if values else _DEFAULT_DECIMAL
    if not 1 <= precision <= _MAX_DECIMAL_PRECISION or not 0 <= scale <= precision:
        raise ValueError(
            f"DECIMAL({precision},{scale}) at position {token.position}: precision must be 1 to "
            f"{_MAX_DECIMAL_PRECISION} and scale 0 to the precision"
        )
    return DecimalType(precision, scale)


def _unescape(quoted: str) -> str:
    """The content of a quoted string literal, with backslash escapes resolved."""
    return re.sub(r"\\(.)", lambda m: _ESCAPES.get(m[1], m[1]), quoted[1:-1], flags=re.DOTALL)


def _backquote(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def _single_quote(text: str) -> str:
    escaped = text.replace("\\", "\\\\").replace("'", "\\'").replace("\n", "\\n")
    return f"'{escaped}'"
