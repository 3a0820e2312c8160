"""Storage the job cannot write: the one-line errors naming the table or folder and what to
do (`commit.table_write_error`, `commit.no_space_error`, `commit.spark_error_reason`)."""

from __future__ import annotations

import errno

from retrylib.batch.spark_errors import no_space_error, spark_error_reason, table_write_error
from retrylib.config.table_ref import TableRef


class _Throwable:
    """Stands for a py4j Java exception: a cause chain with toString()."""

    def __init__(self, text: str, cause: _Throwable | None = None) -> None:
        self.text, self.cause = text, cause

    def getCause(self) -> _Throwable | None:  # Java's name
        return self.cause

    def toString(self) -> str:  # Java's name
        return self.text


def test_the_reason_of_a_spark_failure_is_its_root_cause():
    error = Exception("An error occurred while calling o176.save.\n: long trace")
    error.java_exception = _Throwable(  # type: ignore[attr-defined]
        "org.apache.spark.SparkException: job aborted",
        _Throwable("java.io.FileNotFoundException: /t/_delta_log/x.tmp (Permission denied)"),
    )

    assert spark_error_reason(error) == (
        "java.io.FileNotFoundException: /t/_delta_log/x.tmp (Permission denied)"
    )
    assert spark_error_reason(ValueError("\n  first line\nsecond")) == "first line"


def test_a_table_write_error_names_the_key_the_path_and_what_to_check():
    reason = "java.io.FileNotFoundException: /t/out/_delta_log/x.tmp (Permission denied)"

    error = table_write_error(3, "output.table", TableRef("/t/out", is_path=True), reason)

    assert str(error) == (
        f"cannot append batch 3 to the table of output.table (at /t/out): {reason}. Check that "
        "the job may write there: the table's files and its _delta_log (permissions, a "
        "read-only or full file system, storage credentials, catalog grants). Nothing is "
        "lost: once it is fixed, restart the job and the batch is written, once"
    )


def test_a_table_error_that_is_not_the_storage_points_at_the_columns():
    error = table_write_error(
        0, "dead_letter.table", TableRef("main.ops.dlq", is_path=False), "[DELTA_X] mismatch"
    )

    assert "(catalog table main.ops.dlq): [DELTA_X] mismatch. Check the table:" in str(error)
    assert "retrylib check --tables" in str(error)


def test_a_full_disk_names_the_folder_a_task_was_writing():
    error = Exception(
        "[TASK_WRITE_FAILED] Task failed while writing rows to file:/c/retrylib/staged/4. "
        "SQLSTATE: 58030"
    )
    error.java_exception = _Throwable(  # type: ignore[attr-defined]
        "org.apache.spark.SparkException: task failed",
        _Throwable("java.io.IOException: No space left on device"),
    )

    full = no_space_error(error)

    assert full is not None
    assert str(full).startswith(
        "no space left on the file system of file:/c/retrylib/staged/4: free space there"
    )
    assert "restart the job" in str(full)


def test_a_full_disk_under_python_names_its_file_and_other_errors_are_not_one():
    try:
        try:
            raise OSError(errno.ENOSPC, "No space left on device", "/c/retrylib/manifests/4")
        except OSError as cause:
            raise RuntimeError("claiming the manifest failed") from cause
    except RuntimeError as error:
        full = no_space_error(error)

    assert full is not None
    assert "the file system of /c/retrylib/manifests/4:" in str(full)
    assert no_space_error(OSError(errno.EACCES, "Permission denied", "/c")) is None
    assert no_space_error(ValueError("a handler's bug")) is None
    unnamed = no_space_error(OSError(errno.ENOSPC, "No space left on device"))
    assert unnamed is not None and "a file system the job writes to" in str(unnamed)


def test_an_error_chain_that_loops_back_is_walked_once():
    first, second = RuntimeError("first"), RuntimeError("second")
    first.__context__, second.__context__ = second, first

    assert no_space_error(first) is None
