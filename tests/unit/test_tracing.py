"""Handler calls as OpenTelemetry spans (retrylib.task.tracing), with the SDK's in-memory
exporter: no Spark, no broker."""

from __future__ import annotations

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from retrylib.record import Record
from retrylib.task.tracing import SPAN_NAME, HandlerSpans, handler_spans

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"


def record(attempt: int) -> Record:
    headers = [("trace", b"t"), ("traceparent", f"00-{TRACE_ID}-{PARENT_ID}-01".encode())]
    return Record(b"k", b"v", headers, "orders", 2, 41, 1_000, attempt)


def test_each_attempt_of_a_record_is_a_span_of_its_trace_with_its_outcome():
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    spans = HandlerSpans(provider.get_tracer("test"), tiers=2)

    def fails(_: Record) -> None:
        raise RuntimeError("down")

    for attempt in (0, 1):
        with pytest.raises(RuntimeError):
            spans.call(record(attempt), fails)
    assert spans.call(record(2), lambda r: {"id": r.key}) == {"id": b"k"}

    finished = exporter.get_finished_spans()
    assert [s.name for s in finished] == [SPAN_NAME] * 3
    assert {format(s.context.trace_id, "032x") for s in finished} == {TRACE_ID}
    assert {format(s.parent.span_id, "016x") for s in finished} == {PARENT_ID}
    assert [
        (
            s.attributes["retrylib.attempt"],
            s.attributes["retrylib.tier"],
            s.attributes["retrylib.outcome"],
        )
        for s in finished
    ] == [(0, 0, "failed"), (1, 1, "failed"), (2, 2, "handled")]
    assert [s.status.status_code for s in finished] == [
        StatusCode.ERROR,
        StatusCode.ERROR,
        StatusCode.UNSET,
    ]
    assert finished[0].events[0].name == "exception"
    assert (
        finished[0].attributes["messaging.destination.name"],
        finished[0].attributes["messaging.kafka.offset"],
    ) == ("orders", 41)


def test_a_record_without_a_trace_starts_one():
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    spans = HandlerSpans(provider.get_tracer("test"), tiers=2)

    spans.call(Record(b"k", b"v", [], "orders", 0, 0, 0, 5), lambda r: None)

    (span,) = exporter.get_finished_spans()
    assert span.parent is None and span.attributes["retrylib.tier"] == 2  # the last tier


def test_no_spans_unless_the_process_set_a_tracer_provider():
    assert handler_spans(2) is None  # opentelemetry-api's own default: a proxy of no-ops
