"""What a routing task returns to Spark: every decision of the batch, as rows of one schema.

Each row is one of:

- `kind = "output"`: a row for the output table, in the `output` struct;
- `kind = "dead_letter"`: a row for the dead-letter table, in `dead_letter`;
- `kind = "staged"`: a record to produce to a retry tier or the dead-letter topic, in `staged`;
- `kind = "counters"`: one per task, its counters as a JSON object in `counters`.

The driver writes these rows to the batch's staging folder through Spark before any effect,
so a replayed batch reads its decisions back instead of calling the handler again.
"""

from __future__ import annotations

import pyarrow as pa

from retrylib.delta.dead_letter import DEAD_LETTER_SCHEMA
from retrylib.kafka.staging import STAGED_SCHEMA

KINDS = ("output", "dead_letter", "staged")


def _nullable(schema: pa.Schema) -> pa.StructType:
    # A row of one kind leaves the other structs null; Arrow refuses null parents over
    # non-nullable children, so the structs are nullable throughout (the output table still
    # enforces its own NOT NULL columns on write).
    return pa.struct([field.with_nullable(True) for field in schema])


def result_schema(output: pa.Schema) -> pa.Schema:
    """The Arrow schema of a task's result rows for a handler with `output` columns."""
    return pa.schema(
        [
            ("kind", pa.string()),
            ("output", _nullable(output)),
            ("dead_letter", _nullable(DEAD_LETTER_SCHEMA)),
            ("staged", _nullable(STAGED_SCHEMA)),
            ("counters", pa.string()),
        ]
    )


def result_struct(output: pa.Schema):
    """`result_schema` as the Spark StructType that `mapInArrow` is given."""
    from pyspark.sql.pandas.types import from_arrow_schema

    return from_arrow_schema(result_schema(output))


class ResultRows:
    """Result rows of one task, gathered until the task hands them to Spark."""

    def __init__(self, output: pa.Schema) -> None:
        self.schema = result_schema(output)
        self._structs = {kind: self.schema.field(kind).type for kind in KINDS}
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
