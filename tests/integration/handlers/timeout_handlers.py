"""Handlers that run past `handler.timeout` in each way a call can resist being stopped
(test_call_bounds_job.py); behaviour is chosen by the record key's prefix.

loop-*      retries its service under `except Exception`, for ever: the most common shape
catchall-*  catches `BaseException` in a loop
sigblock-*  blocks SIGALRM and sleeps
cwait-*     blocks SIGALRM and waits in select(), in C
gil-*       backtracks in `re`, in C code that holds the GIL (no thread of the worker runs)
anything else succeeds at once

`stubborn_hook` and `arrow_by_key` resist the same way as a record hook and a vectorised
handler. A call that misbehaves first makes `<key>.<pid>` in the folder $RETRYLIB_TEST_MARKS.
"""

from __future__ import annotations

import os
import re
import select
import signal
import time

import pyarrow as pa
from job_handlers import _row

from retrylib import Record


def _started(key: str) -> None:
    marks = os.environ.get("RETRYLIB_TEST_MARKS")
    if marks:
        open(os.path.join(marks, f"{key}.{os.getpid()}"), "w").close()


def _call_service(key: str) -> dict:
    raise ConnectionError(f"the service for {key} is down")


def by_key(record: Record) -> dict | None:
    key = record.key.decode()
    prefix = key.split("-", 1)[0]
    if prefix not in ("loop", "catchall", "sigblock", "cwait", "gil"):
        return _row(record)
    _started(key)
    if prefix == "loop":
        while True:
            try:
                return _call_service(key)
            except Exception:
                time.sleep(0.2)
    if prefix == "catchall":
        _catch_everything_for_ever()
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
    if prefix == "sigblock":
        time.sleep(3600)
    elif prefix == "cwait":
        select.select([], [], [], 3600)
    else:
        re.match(r"(a+)+$", "a" * 60 + "b")
    return None


def _catch_everything_for_ever() -> None:
    while True:
        try:
            time.sleep(0.2)
        except BaseException:
            pass


def stubborn_hook(record: Record) -> None:
    """A `before_record` hook whose calls for `hookstuck-*` records never stop."""
    if record.key.startswith(b"hookstuck-"):
        _catch_everything_for_ever()


def arrow_by_key(batch: pa.RecordBatch) -> list[dict]:
    """A vectorised handler whose call never stops for a batch holding a `catchall-*`
    record: every record of that call fails with it."""
    rows = batch.to_pylist()
    if any(row["key"].startswith(b"catchall-") for row in rows):
        _catch_everything_for_ever()
    return [
        {
            "key": row["key"].decode(),
            "value": row["value"].decode(),
            "topic": row["topic"],
            "partition": row["partition"],
            "offset": row["offset"],
            "attempt": row["attempt"],
        }
        for row in rows
    ]
