"""What a routing task returns to Spark: every decision of the batch, as rows of one schema.

Each row is one of:

- `kind = "output"`: a row for the output table, in the `output` struct;
- `kind = "dead_letter"`: a row for the dead-letter table, in `dead_letter`;
- `kind = OUTGOING_KIND` ("staged"): an outgoing record, to produce to a retry tier, the
  dead-letter topic or a delay router's destination, in the struct of the same name;
- `kind = "lateness"`: a retry record handed to the handler, in `lateness`: its tier and how
  long after it was due that happened (`LATENESS_SCHEMA`);
- `kind = "key_state"`: with `retry.key_ordered`, a key's queue as the task left it, in
  `key_state` (`key_order.KEY_STATE_SCHEMA`);
- `kind = "counters"`: one per task, its counters as a JSON object in `counters`; a delay
  router's task adds `NOT_BEFORE_MS` there, which is not a counter (see it).

The driver writes these rows to the batch's staging folder through Spark before any effect,
so a replayed batch reads its decisions back instead of calling the handler again. On their
way there every row is `placed`: given the routing task's partition (`unit`) and its place in
the task's output (`seq`), which fix the produce unit of an outgoing record
(`produce_units`).
"""

from __future__ import annotations

import pyarrow as pa

from retrylib.retry.key_order import KEY_STATE_SCHEMA
from retrylib.sinks.dead_letter import DEAD_LETTER_SCHEMA
from retrylib.sinks.outgoing_records import OUTGOING_SCHEMA

OUTGOING_KIND = "staged"
"""The kind of the result rows that hold an outgoing record, and the name of their struct.
It is written to the staging folder and to the manifest's counts, which a replayed batch reads
back, possibly in a newer version of retrylib: the value stays "staged"."""
KINDS = ("output", "dead_letter", OUTGOING_KIND, "lateness", "key_state")
NOT_BEFORE_MS = "not_before_ms"
"""The key, in a task's counters object, of the epoch milliseconds before which none of the
task's outgoing records may be produced: a delay router's records read ahead of their due
time. The driver takes the batch's latest into its manifest (`routing_stage`), not into its
counters, and the produce units wait for it."""
LATENESS_SCHEMA = pa.schema(
    [
        pa.field("tier", pa.int32(), nullable=False),  # 0 = the first retry tier
        pa.field("lateness_ms", pa.int64(), nullable=False),  # handled minus due
    ]
)


def _nullable(schema: pa.Schema) -> pa.StructType:
    # A row of one kind leaves the other structs null; Arrow refuses null parents over
    # non-nullable children, so the structs are nullable throughout (the output table still
    # enforces its own NOT NULL columns on write).
    return pa.struct([field.with_nullable(True) for field in schema])


def result_schema(output: pa.Schema | None) -> pa.Schema:
    """The Arrow schema of a task's result rows for a handler with `output` columns; with
    None (a delay router's tasks), rows have no `output` struct."""
    outputs = [] if output is None else [("output", _nullable(output))]
    return pa.schema(
        [
            ("kind", pa.string()),
            *outputs,
            ("dead_letter", _nullable(DEAD_LETTER_SCHEMA)),
            (OUTGOING_KIND, _nullable(OUTGOING_SCHEMA)),
            ("lateness", _nullable(LATENESS_SCHEMA)),
            ("key_state", _nullable(KEY_STATE_SCHEMA)),
            ("counters", pa.string()),
        ]
    )


PLACE_FIELDS = (
    pa.field("unit", pa.int32(), nullable=False),
    pa.field("seq", pa.int64(), nullable=False),
)


def result_struct(output: pa.Schema | None):
    """`result_schema` with the `PLACE_FIELDS`, as the Spark StructType that `mapInArrow` is
    given."""
    from pyspark.sql.pandas.types import from_arrow_schema

    schema = result_schema(output)
    for place in PLACE_FIELDS:
        schema = schema.append(place)
    return from_arrow_schema(schema)


def placed(batch: pa.RecordBatch, unit: int, first_seq: int) -> pa.RecordBatch:
    """Result rows `batch` with `unit` and their `seq` from `first_seq` on."""
    rows = batch.num_rows
    return batch.append_column(PLACE_FIELDS[0], pa.array([unit] * rows, pa.int32())).append_column(
        PLACE_FIELDS[1], pa.array(range(first_seq, first_seq + rows), pa.int64())
    )


class ResultRows:
    """Result rows of one task, gathered until the task hands them to Spark."""

    def __init__(self, output: pa.Schema | None) -> None:
        self.schema = result_schema(output)
        self._structs = {
            kind: self.schema.field(kind).type for kind in KINDS if kind in self.schema.names
        }
        self._batches: list[pa.RecordBatch] = []

    def add(self, kind: str, batch: pa.RecordBatch) -> None:
        """Add the rows of `batch` (columns of `kind`'s schema) as rows of `kind`."""
        rows = batch.num_rows
        if rows == 0:
            return
        columns = [pa.array([kind] * rows, pa.string())]
        for other, struct in self._structs.items():
            if other == kind:
                columns.append(pa.StructArray.from_arrays(batch.columns, fields=list(struct)))
            else:
                columns.append(pa.nulls(rows, struct))
        columns.append(pa.nulls(rows, pa.string()))
        self._batches.append(pa.RecordBatch.from_arrays(columns, schema=self.schema))

    def counters(self, payload: str) -> pa.RecordBatch:
        """The task's one counters row."""
        columns = [pa.array(["counters"], pa.string())]
        columns += [pa.nulls(1, struct) for struct in self._structs.values()]
        columns.append(pa.array([payload], pa.string()))
        return pa.RecordBatch.from_arrays(columns, schema=self.schema)

    def drain(self) -> list[pa.RecordBatch]:
        """The rows gathered so far; the buffer is empty after."""
        batches, self._batches = self._batches, []
        return batches


def output_batch(rows: list[dict], schema: pa.Schema) -> pa.RecordBatch:
    """`rows` as a RecordBatch of `schema`.

    Raises `ValueError` naming a NOT NULL column (or struct field, list element, map key or
    value) left empty: Arrow builds such a batch, but the Parquet writer refuses it, which
    would fail the task, and every replay of the batch, instead of the one record.
    """
    batch = pa.RecordBatch.from_pylist(rows, schema=schema)
    for column_field, column in zip(schema, batch.columns, strict=True):
        _check_not_null(column_field, column, column_field.name)
    return batch


def _check_not_null(field: pa.Field, array: pa.Array, path: str) -> None:
    if not field.nullable and array.null_count:
        raise ValueError(f"column {path!r} is NOT NULL, but a row has no value for it")
    kind = field.type
    if pa.types.is_struct(kind):
        present = array.filter(array.is_valid())
        for i in range(kind.num_fields):
            child = kind.field(i)
            _check_not_null(child, present.field(i), f"{path}.{child.name}")
    elif pa.types.is_map(kind):
        _check_not_null(kind.key_field, array.keys, f"{path}.key")
        _check_not_null(kind.item_field, array.items, f"{path}.value")
    elif pa.types.is_list(kind) or pa.types.is_large_list(kind):
        _check_not_null(kind.value_field, array.flatten(), f"{path}[]")
