"""Delta files and idempotent commits with delta-rs on a local directory (no Spark)."""

from __future__ import annotations

import pyarrow as pa

from retrylib.delta_sink import DataFile, DataFileWriter, commit_files, ensure_table, read_table

SCHEMA = pa.schema([("id", pa.string()), ("n", pa.int64())])


def write_file(table: str, batch_id: int, ids: list[str]) -> DataFile:
    writer = DataFileWriter(table, SCHEMA, batch_id)
    writer.write(pa.RecordBatch.from_pylist([{"id": i, "n": 1} for i in ids], schema=SCHEMA))
    data_file = writer.close()
    assert data_file is not None
    return data_file


def test_commit_is_once_per_app_and_batch(tmp_path):
    table = str(tmp_path / "t")
    ensure_table(table, SCHEMA, "output")
    first = write_file(table, 3, ["a", "b"])

    assert commit_files(table, SCHEMA, [first], app_id="job-1", batch_id=3)
    again = write_file(table, 3, ["a", "b"])  # a replay writes new files for the same batch
    assert not commit_files(table, SCHEMA, [again], app_id="job-1", batch_id=3)
    assert not commit_files(table, SCHEMA, [again], app_id="job-1", batch_id=2)

    assert sorted(read_table(table).column("id").to_pylist()) == ["a", "b"]


def test_other_app_id_commits_its_own_batches(tmp_path):
    table = str(tmp_path / "t")
    ensure_table(table, SCHEMA, "output")
    commit_files(table, SCHEMA, [write_file(table, 0, ["a"])], app_id="job-1", batch_id=0)

    assert commit_files(table, SCHEMA, [write_file(table, 0, ["b"])], app_id="job-2", batch_id=0)
    assert sorted(read_table(table).column("id").to_pylist()) == ["a", "b"]


def test_writer_without_rows_writes_no_file(tmp_path):
    writer = DataFileWriter(str(tmp_path / "t"), SCHEMA, 0)
    writer.write(pa.RecordBatch.from_pylist([], schema=SCHEMA))
    assert writer.close() is None
    assert not (tmp_path / "t").exists()


def test_data_file_round_trips_as_json():
    data_file = DataFile("/x/t", "part-1.parquet", 123, 4)
    assert DataFile.from_json(data_file.to_json()) == data_file


def test_existing_table_with_other_columns_is_refused(tmp_path):
    import pytest

    from retrylib.errors import RetrylibError

    table = str(tmp_path / "t")
    ensure_table(table, SCHEMA, "output")
    with pytest.raises(RetrylibError, match="output table .* has columns"):
        ensure_table(table, pa.schema([("other", pa.string())]), "output")
