"""Delta tables written the exactly-once way: executors write Parquet, the driver commits once.

Executors write data files straight into the table's directory; they are invisible until the
driver commits them. The commit carries an app transaction (app id = job name, version =
batch id), the same `txn` action Spark's Delta writer records for `txnAppId`/`txnVersion`, so
committing a replayed batch again is detected and skipped. Files of a batch that never
commits stay orphaned and are removed by VACUUM.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from deltalake import DeltaTable, QueryBuilder
from deltalake.transaction import AddAction, CommitProperties, Transaction

from retrylib.errors import RetrylibError
from retrylib.storage import filesystem

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DataFile:
    """A Parquet file written into a table's directory, not yet committed."""

    table: str
    path: str  # relative to the table root
    size: int
    num_records: int

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> DataFile:
        return cls(**json.loads(text))


def ensure_table(uri: str, schema: pa.Schema, what: str) -> None:
    """Create the Delta table at `uri` with `schema` unless it exists.

    Raises `RetrylibError` when an existing table's columns differ from `schema`, naming
    both, since appending would fail later in every batch.
    """
    table = DeltaTable.create(uri, schema=schema, mode="ignore")
    existing = pa.schema(table.schema().to_arrow())
    if existing.names != schema.names:
        raise RetrylibError(
            f"{what} table {uri} has columns {existing.names}, expected {schema.names}: "
            "point the config at a new table path or migrate the table"
        )


class DataFileWriter:
    """Writes one Parquet file into a table directory, opened on the first batch written."""

    def __init__(self, table: str, schema: pa.Schema, batch_id: int) -> None:
        self.table = table
        self.schema = schema
        self._name = f"part-{batch_id:010d}-{uuid.uuid4().hex}.snappy.parquet"
        self._writer: pq.ParquetWriter | None = None
        self._fs: pafs.FileSystem | None = None
        self._root = ""
        self.num_records = 0

    def write(self, batch: pa.RecordBatch) -> None:
        if batch.num_rows == 0:
            return
        if self._writer is None:
            self._fs, self._root = filesystem(self.table)
            self._fs.create_dir(self._root, recursive=True)
            self._writer = pq.ParquetWriter(
                f"{self._root}/{self._name}",
                self.schema,
                filesystem=self._fs,
                compression="snappy",
            )
        self._writer.write_batch(batch)
        self.num_records += batch.num_rows

    def close(self) -> DataFile | None:
        """Close the file; returns its description, or None when nothing was written."""
        if self._writer is None:
            return None
        self._writer.close()
        size = self._fs.get_file_info(f"{self._root}/{self._name}").size
        return DataFile(self.table, self._name, size, self.num_records)


def committed_batch(uri: str, app_id: str) -> int | None:
    """The last batch id committed to the table under `app_id`, or None."""
    return DeltaTable(uri).transaction_version(app_id)


def commit_files(
    uri: str, schema: pa.Schema, files: Sequence[DataFile], *, app_id: str, batch_id: int
) -> bool:
    """Commit `files` to the table at `uri` once for (app_id, batch_id).

    Returns False (and commits nothing) when the table already holds a commit for this or a
    later batch of `app_id`. Commits even an empty file list, so the transaction marks the
    batch as done.
    """
    table = DeltaTable(uri)
    done = table.transaction_version(app_id)
    if done is not None and done >= batch_id:
        log.info("batch %d already committed to %s; skipped", batch_id, uri)
        return False
    now_ms = int(time.time() * 1000)
    actions = [
        AddAction(f.path, f.size, {}, now_ms, True, json.dumps({"numRecords": f.num_records}))
        for f in files
    ]
    table.create_write_transaction(
        actions,
        mode="append",
        schema=schema,
        commit_properties=CommitProperties(
            app_transactions=[Transaction(app_id, batch_id, now_ms)],
            custom_metadata={"retrylib.batch": str(batch_id)},
        ),
    )
    return True


def read_table(uri: str, where: str | None = None) -> pa.Table:
    """Read the current snapshot of a Delta table (optionally filtered by a SQL predicate)."""
    table = DeltaTable(uri)
    sql = "SELECT * FROM t" + (f" WHERE {where}" if where else "")
    result = pa.table(QueryBuilder().register("t", table).execute(sql).read_all())
    # The query engine answers with view types (string_view); give callers the table's types.
    return result.cast(pa.schema(table.schema().to_arrow()))


def total_records(files: Iterable[DataFile]) -> int:
    return sum(f.num_records for f in files)
