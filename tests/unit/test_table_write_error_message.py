"""A table the job cannot write: the one-line error naming the table, its location and what
to check (`commit.table_write_error`, `commit.spark_error_reason`)."""

from __future__ import annotations

from retrylib.batch.commit import spark_error_reason, table_write_error
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
