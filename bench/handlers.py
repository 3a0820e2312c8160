"""Handlers the benchmark runs, the same functions in every contender.

Input values start with a marker byte: `FAIL_MARK` for records chosen to fail (see
`bench.data.marked_to_fail`), `OK_MARK` for the rest. `trivial` ignores the marker;
`flaky` fails a marked record on its first delivery only (attempt 0), so a failure rate
puts that share of the input on the retry path and every retry would succeed. The soak
(`bench.soak`) marks a further share `DEAD_MARK`: `soak` fails those on every attempt, so
they end in the dead letter.
"""

from __future__ import annotations

import time

FAIL_MARK = b"F"
OK_MARK = b"S"
DEAD_MARK = b"D"

OUTPUT_DDL = "partition INT, offset BIGINT, size INT"
LATENESS_DDL = "partition INT, offset BIGINT, attempt INT, handled_at_ms BIGINT"


class BenchTransientError(Exception):
    """The failure `flaky` and `late_stamp` raise on a marked record's first delivery."""


class BenchPoisonError(Exception):
    """The failure `soak` raises on every delivery of a `DEAD_MARK` record."""


def trivial(record) -> dict:
    """One small output row per record; no parsing, no failures."""
    return {"partition": record.partition, "offset": record.offset, "size": len(record.value)}


def waiting_io(record) -> dict:
    """`trivial` after a 5 ms wait, as a call to another service would make (`lanes`)."""
    time.sleep(0.005)
    return {"partition": record.partition, "offset": record.offset, "size": len(record.value)}


def flaky(record) -> dict:
    """`trivial`, except that a marked record fails on attempt 0."""
    if record.attempt == 0 and record.value[:1] == FAIL_MARK:
        raise BenchTransientError("marked to fail once")
    return {"partition": record.partition, "offset": record.offset, "size": len(record.value)}


def soak(record) -> dict:
    """`flaky`, except that a `DEAD_MARK` record fails on every attempt (a dead letter)."""
    if record.value[:1] == DEAD_MARK:
        raise BenchPoisonError("marked to fail on every attempt")
    return flaky(record)


def late_stamp(record) -> dict:
    """For the lateness run: a marked record fails once; every output row carries the
    wall-clock time (epoch ms) at which the handler ran."""
    if record.attempt == 0 and record.value[:1] == FAIL_MARK:
        raise BenchTransientError("marked to fail once")
    return {
        "partition": record.partition,
        "offset": record.offset,
        "attempt": record.attempt,
        "handled_at_ms": int(time.time() * 1000),
    }


def trivial_arrow(batch):
    """`trivial` as a vectorised handler (`handler.kind = "arrow"`): one call per Arrow
    batch, one output row per input row, no per-record Python."""
    import pyarrow as pa
    import pyarrow.compute as pc

    return pa.RecordBatch.from_arrays(
        [batch.column("partition"), batch.column("offset"), pc.binary_length(batch["value"])],
        names=["partition", "offset", "size"],
    )


HANDLERS = {"trivial": trivial, "flaky": flaky, "soak": soak, "late_stamp": late_stamp}
