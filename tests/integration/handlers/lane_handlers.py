"""A handler that waits as I/O does (20 ms) and notes each call: a JSON line with the key,
offset, start and end time appended to the file RETRYLIB_TEST_CALL_LOG names."""

from __future__ import annotations

import json
import os
import time

from retrylib import Record


def waiting(record: Record) -> dict:
    started = time.time()
    time.sleep(0.02)
    call = {
        "key": record.key.decode(),
        "offset": record.offset,
        "start": started,
        "end": time.time(),
    }
    with open(os.environ["RETRYLIB_TEST_CALL_LOG"], "a") as log:  # one short O_APPEND write
        log.write(json.dumps(call) + "\n")
    return {"key": call["key"], "offset": record.offset}
