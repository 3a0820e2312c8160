"""The handler of the fault-injection harness; behaviour is chosen by the record key's prefix.

ok-*       succeeds at once (output row with attempt 0)
flaky1-*   fails with TransientError on attempt 0, succeeds on attempt 1 (the 2nd call)
flaky2-*   fails on attempts 0 and 1, succeeds on attempt 2 (the 3rd call)
always-*   always fails with RuntimeError: dead-lettered after max_attempts calls
bad-*      raises ValueError (configured non-retryable): dead-lettered after one call

With RETRYLIB_FAULTS_CALL_LOG set, every call appends "key attempt" to that file, so the
harness can report how often a record was handed over in all (replays included).
"""

from __future__ import annotations

import os

from retrylib import Record

OUTPUT_SCHEMA = "key STRING, value STRING, topic STRING, partition INT, offset BIGINT, attempt INT"


class TransientError(Exception):
    """A failure that goes away on a later attempt."""


def handle(record: Record) -> dict:
    key = record.key.decode()
    log_path = os.environ.get("RETRYLIB_FAULTS_CALL_LOG")
    if log_path:
        with open(log_path, "a") as log:  # one short O_APPEND write per call
            log.write(f"{key} {record.attempt}\n")
    prefix = key.split("-", 1)[0]
    if prefix.startswith("flaky") and record.attempt < int(prefix[5:]):
        raise TransientError(f"not yet: attempt {record.attempt}")
    if prefix == "always":
        raise RuntimeError("always fails")
    if prefix == "bad":
        raise ValueError("bad record")
    return {
        "key": key,
        "value": record.value.decode(),
        "topic": record.topic,
        "partition": record.partition,
        "offset": record.offset,
        "attempt": record.attempt,
    }
