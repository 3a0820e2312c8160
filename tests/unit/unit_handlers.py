"""Handlers for the unit tests of the batch task: behaviour by key."""

from __future__ import annotations

import threading

from retrylib import NonRetryable, Record, RetryAfter, Skip


def by_key(record: Record) -> dict | None:
    key = record.key.decode()
    if key.startswith("fail"):
        raise RuntimeError("boom")
    if key.startswith("stop"):
        raise NonRetryable("no")
    if key.startswith("wrongtype"):
        return {"key": key, "attempt": "not a number"}
    if key.startswith("none"):
        return None
    if key.startswith("skip"):
        raise Skip("not ours")
    if key.startswith("after-"):  # "after-<seconds>": ask to be retried that much later
        raise RetryAfter(float(key.removeprefix("after-")))
    if key.startswith("deep"):  # fails on every attempt, with a long message and a deep stack
        _fail_deep(200, "a long reason " * 1000)
    if key.startswith("headers"):  # fails once, with the headers it was given as the message
        raise RuntimeError(repr(record.headers))
    return {"key": key, "topic": record.topic, "offset": record.offset, "attempt": record.attempt}


def _fail_deep(depth: int, message: str) -> None:
    if depth:
        _fail_deep(depth - 1, message)
    raise RuntimeError(message)


def arrow_table(batch):
    """Vectorised: one output row per input row, as an Arrow table."""
    import pyarrow as pa

    return pa.table(
        {
            "key": [k.decode() for k in batch.column("key").to_pylist()],
            "topic": batch.column("topic"),
            "offset": batch.column("offset"),
            "attempt": batch.column("attempt"),
        }
    )


def arrow_rows(batch):
    """Vectorised: per-row results; keys starting with "fail" fail."""
    results = []
    keys, attempts = batch.column("key").to_pylist(), batch.column("attempt").to_pylist()
    for key, attempt in zip(keys, attempts, strict=True):
        key = key.decode()
        results.append(
            RuntimeError("boom") if key.startswith("fail") else {"key": key, "attempt": attempt}
        )
    return results


def pandas_frame(frame):
    """Vectorised over pandas: one output row per input row."""
    return frame.assign(key=frame["key"].map(bytes.decode))[["key", "topic", "offset", "attempt"]]


def arrow_raises(batch):
    raise RuntimeError("whole batch failed")


# Lifecycle hooks: each records what it was told in EVENTS; `broken` always raises.
EVENTS: list[tuple] = []


def before(record: Record) -> None:
    EVENTS.append(("before", record.key))


def after(record: Record, error: BaseException | None) -> None:
    EVENTS.append(("after", record.key, None if error is None else type(error).__name__))


def retried(record: Record, tier: int, error: BaseException) -> None:
    EVENTS.append(("retry", record.key, tier, type(error).__name__))


def dead(record: Record, reason: str, error: BaseException) -> None:
    EVENTS.append(("dead", record.key, str(reason)))


def broken(*args: object) -> None:
    raise SystemExit("a hook that raises anything at all")


RELEASE = threading.Event()
"""What `stuck` waits for."""


def stuck(*args: object) -> None:
    """A hook that does not return until `RELEASE` is set."""
    EVENTS.append(("stuck", *args))
    RELEASE.wait()
