"""What a failed Spark job means, said for an operator: a retrylib error a task raised, a full
file system, a table the job cannot append to."""

from __future__ import annotations

import errno
import re

from retrylib import errors
from retrylib.config.table_ref import TableRef
from retrylib.errors import RetrylibError, TableWriteError, causes

_TASK_ERROR = re.compile(r"retrylib\.errors\.(\w+): ([^\n]*)")


def task_error(error: BaseException) -> RetrylibError | None:
    """The retrylib error that failed a Spark task, as Spark reports it to the driver (the
    last one its Python traceback names), or None when no such error is named."""
    found = _TASK_ERROR.findall(str(error))
    for name, message in reversed(found):
        kind = getattr(errors, name, None)
        if isinstance(kind, type) and issubclass(kind, RetrylibError):
            return kind(message)
    return None


_NO_SPACE = "No space left on device"
_WRITING_TO = re.compile(r"Task failed while writing rows to (\S+?)\.?(?:\s|$)")


def no_space_error(error: BaseException) -> RetrylibError | None:
    """The error for a batch that failed because a file system it writes to is full, naming
    the folder being written when Spark's error (a task's write) or Python's (`OSError`)
    says, or None when something else failed it."""
    text = f"{error}\n{spark_error_reason(error)}"
    oserror = _enospc(error)
    if _NO_SPACE not in text and oserror is None:
        return None
    found = _WRITING_TO.search(text)
    where = found.group(1) if found else oserror.filename if oserror is not None else None
    place = (
        f"the file system of {where}"
        if where
        else "a file system the job writes to (its checkpoint, its tables, Spark's local folders)"
    )
    return RetrylibError(
        f"no space left on {place}: free space there, or give the job's checkpoint and tables "
        "a larger one. Nothing is lost: restart the job and the batch that failed runs again"
    )


def _enospc(error: BaseException) -> OSError | None:
    """The first `OSError` of "no space left on device" in `error`'s chain, else None."""
    return next(
        (e for e in causes(error) if isinstance(e, OSError) and e.errno == errno.ENOSPC), None
    )


def table_write_error(batch_id: int, key: str, table: TableRef, reason: str) -> TableWriteError:
    """The error for batch `batch_id` failing to append to the table of config key `key`
    because of `reason` (`spark_error_reason`): where the table is, what to check, and that
    a restart after the fix writes the batch once.
    """
    where = f"at {table.resolved()}" if table.is_path else f"catalog table {table}"
    if any(marker in reason for marker in _STORAGE_ERROR_MARKERS):
        check = (
            "Check that the job may write there: the table's files and its _delta_log "
            "(permissions, a read-only or full file system, storage credentials, catalog grants)"
        )
    else:
        check = (
            "Check the table: `retrylib check --tables` compares its columns with what the job "
            "writes"
        )
    return TableWriteError(
        f"cannot append batch {batch_id} to the table of {key} ({where}): {reason}. {check}. "
        "Nothing is lost: once it is fixed, restart the job and the batch is written, once"
    )


_STORAGE_ERROR_MARKERS = ("java.io.", "java.nio.", "AccessDenied", "Permission", "not permitted")
"""Parts of a root cause that say the storage refused (rather than Delta or the schema)."""


def spark_error_reason(error: BaseException) -> str:
    """One line saying why Spark failed: the root cause of a Java exception (the storage's
    own words, such as "java.io.FileNotFoundException: ... (Permission denied)"), else the
    first line of the error's message.
    """
    throwable = getattr(error, "java_exception", None)  # py4j's Py4JJavaError
    try:
        while throwable is not None and throwable.getCause() is not None:
            throwable = throwable.getCause()
        if throwable is not None:
            return str(throwable.toString())
    except Exception:  # a gateway that is going away: fall back to the Python text
        pass
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return lines[0] if lines else type(error).__name__


_TRACEBACK = "Traceback (most recent call last):"


def spark_error_line(text: str) -> str:
    """The first line of a Spark error's `text`; when that line opens a Python traceback (of
    code Spark ran in a Python worker: retrylib's source, the handler), with the traceback's
    exception line in its place."""
    first, *rest = text.splitlines()
    if not first.endswith(_TRACEBACK):
        return first
    raised = next((line for line in rest if line and not line[0].isspace()), None)
    return first.removesuffix(_TRACEBACK) + raised if raised else first
