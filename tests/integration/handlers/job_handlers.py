"""Handlers used by the integration tests; behaviour is chosen by the record key's prefix.

ok-*        succeeds at once
crash-*     kills its Python process on attempt 0, then succeeds
crashalways-*  kills its Python process every time
flaky<N>-*  fails with TransientError until attempt N, then succeeds
always-*    always fails with RuntimeError (dead-lettered once out of attempts)
bad-*       raises ValueError (configured non-retryable: dead-lettered at once)
stop-*      raises NonRetryable
skip-*      raises Skip
after-*     raises RetryAfter(1.5) on attempt 0, then succeeds
afterlong-* raises RetryAfter(15) on attempt 0, then succeeds
afterhuge-* raises RetryAfter(1e17) on every attempt
exit-*      raises SystemExit on attempt 0, then succeeds
hang-*      sleeps far past the timeout on attempt 0, then succeeds
schema-*    returns a row that does not fit the schema on attempt 0, then succeeds
interrupt-* raises KeyboardInterrupt on attempt 0, then succeeds
swallow-*   on attempt 0 sleeps past the timeout under `except Exception: sleep again`,
            which lets the timeout through
badtype-*   returns a str (not a dict) on attempt 0, then succeeds
unknowncol-* returns a row with a column not in the schema on attempt 0, then succeeds
exitalways-* always raises SystemExit (dead-lettered once out of attempts)
hangalways-* always sleeps past the timeout (dead-lettered once out of attempts)
nullkey-*   returns a row without "key" on attempt 0 (breaks `key STRING NOT NULL`)
dep-*       fails with DependencyDown while the file named by $RETRYLIB_TEST_DEPENDENCY_DOWN
            exists (a downstream service that goes down and comes back)
stuck-*     hangs while the file named by $RETRYLIB_TEST_STUCK exists, having made that
            name + ".started" (a call that never returns, as far as a stop can tell)
"""

from __future__ import annotations

import os
import time

from retrylib import NonRetryable, Record, RetryAfter, Skip


class TransientError(Exception):
    """A failure that goes away on a later attempt."""


class DependencyDown(Exception):
    """The handler's downstream service does not answer."""


def _row(record: Record) -> dict:
    return {
        "key": record.key.decode(),
        "value": record.value.decode() if record.value is not None else None,
        "topic": record.topic,
        "partition": record.partition,
        "offset": record.offset,
        "attempt": record.attempt,
    }


def by_key(record: Record) -> dict | None:
    key = record.key.decode()
    prefix = key.split("-", 1)[0]
    first = record.attempt == 0
    if prefix.startswith("flaky") and record.attempt < int(prefix[5:]):
        raise TransientError(f"not yet: attempt {record.attempt}")
    if prefix == "crash" and first or prefix == "crashalways":
        os._exit(13)  # kills the Python worker, as a segfault in native code would
    if prefix == "always":
        raise RuntimeError("always fails")
    if prefix == "dep" and os.path.exists(os.environ.get("RETRYLIB_TEST_DEPENDENCY_DOWN", "")):
        raise DependencyDown("the service is down")
    stuck = os.environ.get("RETRYLIB_TEST_STUCK", "")
    if prefix == "stuck" and os.path.exists(stuck):
        open(f"{stuck}.started", "w").close()
        while os.path.exists(stuck):
            time.sleep(0.2)
    if prefix == "bad":
        raise ValueError("bad order")
    if prefix == "stop":
        raise NonRetryable("gave up")
    if prefix == "skip":
        raise Skip("not for us")
    if prefix == "after" and first:
        raise RetryAfter(1.5)
    if prefix == "afterlong" and first:
        raise RetryAfter(15)
    if prefix == "afterhuge":
        raise RetryAfter(1e17)
    if prefix == "exit" and first:
        raise SystemExit(3)
    if prefix == "hang" and first:
        time.sleep(60)
    if prefix == "schema" and first:
        return {"key": key, "offset": "not a number"}
    if prefix == "interrupt" and first:
        raise KeyboardInterrupt
    if prefix == "swallow" and first:
        try:
            time.sleep(60)
        except Exception:
            time.sleep(60)  # not reached: the timeout is a BaseException
    if prefix == "badtype" and first:
        return f"not a row: {key}"
    if prefix == "unknowncol" and first:
        return {"key": key, "no_such_column": 1}
    if prefix == "nullkey" and first:
        return {"value": "a row without its key"}
    if prefix == "exitalways":
        raise SystemExit("always exits")
    if prefix == "hangalways":
        time.sleep(60)
    return _row(record)


OUTPUT_SCHEMA = "key STRING, value STRING, topic STRING, partition INT, offset BIGINT, attempt INT"


def echo(record: Record) -> dict:
    """Everything the handler was given, as one row (headers as text), for comparing reads."""
    return {
        "key": record.key,
        "value": record.value,
        "partition": record.partition,
        "offset": record.offset,
        "timestamp": record.timestamp,
        "headers": repr(record.headers),
    }
