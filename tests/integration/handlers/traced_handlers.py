"""`job_handlers.by_key` in a worker that traces: importing this module sets the process's
OpenTelemetry tracer provider, whose finished spans are appended, as JSON lines, to the
file named by $RETRYLIB_TEST_SPAN_LOG (as a user's handler module sets up its exporter)."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence

from job_handlers import by_key
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

__all__ = ["by_key"]


class _FileExporter(SpanExporter):
    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        with open(os.environ["RETRYLIB_TEST_SPAN_LOG"], "a") as log:
            for span in spans:
                entry = {
                    "name": span.name,
                    "trace_id": format(span.context.trace_id, "032x"),
                    "parent_id": span.parent and format(span.parent.span_id, "016x"),
                    "attributes": dict(span.attributes or {}),
                }
                log.write(json.dumps(entry) + "\n")
        return SpanExportResult.SUCCESS


_provider = TracerProvider()
_provider.add_span_processor(SimpleSpanProcessor(_FileExporter()))
trace.set_tracer_provider(_provider)
