"""Each handler call as an OpenTelemetry span, continuing the record's trace.

Only when `opentelemetry-api` is installed (the `otel` extra; never required) and the
worker process has a tracer provider of its own by the time its task loads the handler: set
by the handler's module, a `sitecustomize`, or the `opentelemetry-instrument` launcher.
Otherwise the calls are made as they are, at no cost.

The span ("retrylib handle", kind CONSUMER) takes its parent from the record's own headers
(W3C `traceparent` and `tracestate`, or whatever propagator the process set), which travel
unchanged through every retry: the attempts of one record are spans of one trace. Its
attributes name the record (`messaging.destination.name`, `messaging.kafka.partition`,
`messaging.kafka.offset`), the attempt (`retrylib.attempt`, 0 on the first delivery), the
retry tier it came from (`retrylib.tier`, 0 for the main topic) and the call's outcome
(`retrylib.outcome`: `handled` or `failed`, with the exception recorded).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from retrylib.record import Record

SPAN_NAME = "retrylib handle"


class _HeaderGetter:
    """Reads a propagator's fields from a record's headers (UTF-8 text; the last wins)."""

    def get(self, carrier: Sequence[tuple[str, bytes | None]], key: str) -> list[str] | None:
        values = [
            value.decode("utf-8", "replace")
            for name, value in carrier
            if name.lower() == key.lower() and value is not None
        ]
        return values[-1:] or None

    def keys(self, carrier: Sequence[tuple[str, bytes | None]]) -> list[str]:
        return [name for name, _ in carrier]


class HandlerSpans:
    """Runs handler calls in spans of `tracer`; `tiers` is the job's number of retry tiers."""

    def __init__(self, tracer: Any, tiers: int) -> None:
        from opentelemetry.propagate import extract
        from opentelemetry.trace import SpanKind

        self._tracer = tracer
        self._tiers = tiers
        self._extract = extract
        self._kind = SpanKind.CONSUMER
        self._getter = _HeaderGetter()

    def call(self, record: Record, call: Callable[[Record], object]) -> object:
        """`call(record)` in a span whose parent is the trace in `record`'s headers."""
        attributes = {
            "messaging.system": "kafka",
            "messaging.destination.name": record.topic,
            "messaging.kafka.partition": record.partition,
            "messaging.kafka.offset": record.offset,
            "retrylib.attempt": record.attempt,
            "retrylib.tier": min(record.attempt, self._tiers),
        }
        parent = self._extract(record.headers, getter=self._getter)
        with self._tracer.start_as_current_span(
            SPAN_NAME, context=parent, kind=self._kind, attributes=attributes
        ) as span:
            try:
                result = call(record)
            except BaseException:
                span.set_attribute("retrylib.outcome", "failed")
                raise  # the span records it and its status
            span.set_attribute("retrylib.outcome", "handled")
            return result


def handler_spans(tiers: int) -> HandlerSpans | None:
    """`HandlerSpans` when opentelemetry-api is installed and this process set a tracer
    provider; None otherwise (calls are then made without spans)."""
    try:
        from opentelemetry import trace
    except ImportError:
        return None
    provider = trace.get_tracer_provider()
    if isinstance(provider, trace.ProxyTracerProvider | trace.NoOpTracerProvider):
        return None
    return HandlerSpans(provider.get_tracer("retrylib"), tiers)
