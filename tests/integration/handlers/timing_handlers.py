"""A handler that measures retry delays: `timed-*` keys fail once, then report when handled.

On attempt 0 it appends "key failed_at" to the file named by the record's value and
fails; on the retry it returns its handling time (epoch seconds) as the row's value.
Other keys behave as in job_handlers.by_key.
"""

from __future__ import annotations

import time

from job_handlers import TransientError, by_key

from retrylib import Record


def timed_by_key(record: Record) -> dict | None:
    key = record.key.decode()
    if not key.startswith("timed-"):
        return by_key(record)
    if record.attempt == 0:
        with open(record.value.decode(), "a") as out:
            out.write(f"{key} {time.time()}\n")
        raise TransientError("fail once to measure the delay")
    row = by_key(record)
    row["value"] = repr(time.time())
    return row
