"""A handler for key order, its behaviour chosen by the record's value:

fail:N   fails with TransientError until attempt N, then succeeds
never    always fails with RuntimeError (dead-lettered once out of attempts)
anything else succeeds at once

Each success appends a JSON line (key, value, offset, attempt, time) to the file
RETRYLIB_TEST_CALL_LOG names, so a test sees the order records were handled in.
"""

from __future__ import annotations

import json
import os
import time

from job_handlers import TransientError, _row

from retrylib import Record


def ordered(record: Record) -> dict:
    value = record.value.decode()
    if value == "never":
        raise RuntimeError("this record never goes through")
    if value.startswith("fail:") and record.attempt < int(value[5:]):
        raise TransientError(f"not yet: attempt {record.attempt}")
    success = {
        "key": record.key.decode(),
        "value": value,
        "offset": record.offset,
        "attempt": record.attempt,
        "time": time.time(),
    }
    with open(os.environ["RETRYLIB_TEST_CALL_LOG"], "a") as log:  # one short O_APPEND write
        log.write(json.dumps(success) + "\n")
    return _row(record)
