"""A record retried many times carries retry headers of the same size on every attempt:
each retry replaces retrylib's headers (and signature) instead of adding to them, and the
error message and stack trace are cut to their bounds. Driven through the executor's task
(`run_task`), feeding each retry copy back as the next delivery."""

from __future__ import annotations

import dataclasses

from helpers import TIER, outgoing_headers, route

from retrylib.retry.headers import (
    ERROR_STACK_TRACE,
    MAX_STACK_TRACE_BYTES,
    decode_retry_state,
    split_headers,
)
from retrylib.task.results import OUTGOING_KIND

ATTEMPTS = 8


def header_bytes(headers: list[tuple[str, bytes | None]]) -> int:
    return sum(len(name.encode()) + len(value or b"") for name, value in headers)


def test_retry_headers_keep_their_size_over_many_attempts(plan):
    plan = dataclasses.replace(plan, max_attempts=ATTEMPTS)
    user = [("trace", b"t1"), ("tenant", b"acme")]
    delivery = {"key": b"deep-1", "offset": 7, "headers": user}
    sizes, attempts = [], []
    for _ in range(ATTEMPTS - 1):
        _, written = route(plan, [delivery])
        [outgoing] = written[OUTGOING_KIND]
        headers = outgoing_headers(outgoing)
        own = split_headers(headers)[1]
        state = decode_retry_state(own)
        attempts.append(state.attempt)
        sizes.append(header_bytes(headers))
        assert split_headers(headers)[0] == user  # the record's own headers, once, in order
        # The next delivery: this copy read back from its tier once it is due.
        delivery = {
            "key": outgoing["key"],
            "value": outgoing["value"],
            "topic": outgoing["topic"],
            "partition": outgoing["partition"],
            "offset": 100 + state.attempt,
            "headers": headers,
        }
        plan = dataclasses.replace(plan, now_ms=state.not_before_ms + 1)

    _, written = route(plan, [delivery])
    [dead] = [s for s in written[OUTGOING_KIND] if s["topic"] == "orders.dlt"]
    dead_headers = outgoing_headers(dead)

    assert attempts == list(range(1, ATTEMPTS))
    assert delivery["topic"] != TIER  # the later attempts went round the last tier
    assert len(set(sizes)) == 1, sizes  # every attempt's headers are the same size
    trace = split_headers(dead_headers)[1][ERROR_STACK_TRACE]
    assert trace is not None and len(trace) <= MAX_STACK_TRACE_BYTES
    # The dead letter adds attempts, reason and the bounded trace, and nothing else.
    assert header_bytes(dead_headers) <= sizes[0] + MAX_STACK_TRACE_BYTES + 100
