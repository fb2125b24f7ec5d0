"""An OpenTelemetry SDK for worker processes the tests and benchmarks start
(``OTEL_SETUP=tests.otel_setup.configure``): each finished span as one JSON line appended
to the file ``OTEL_SPANS_FILE`` names, or dropped if unset (tracing on, nothing kept)."""

import json
import os

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult


class FileExporter(SpanExporter):
    def __init__(self, path):
        self.path = path

    def export(self, spans):
        if self.path:
            # Opened per export: the worker's children are forked and each appends its own.
            with open(self.path, "a") as f:
                for span in spans:
                    f.write(json.dumps(json.loads(span.to_json())) + "\n")
        return SpanExportResult.SUCCESS


def configure():
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(FileExporter(os.environ.get("OTEL_SPANS_FILE"))))
    trace.set_tracer_provider(provider)
