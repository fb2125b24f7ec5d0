"""An OpenTelemetry SDK for worker processes the tests and benchmarks start
(``OTEL_SETUP=tests.otel_setup.configure``), set up as a site runs one: a
BatchSpanProcessor, whose thread hands finished spans to the exporter in batches, here
each as one JSON line appended to the file ``OTEL_SPANS_FILE`` names, or dropped if unset
(tracing on, nothing kept: worker_throughput.py --tracing).

The worker's children are forked: the SDK starts the processor's thread again in each
(os.register_at_fork) and a child flushes what it holds before it exits
(telemetry.flush), so tests/worker/test_tracing_processes.py, which reads the file once
the worker is gone, sees every attempt's span only if both hold. (The in-process tests'
``spans`` fixture, tests/conftest.py, keeps a SimpleSpanProcessor: they read each span
the moment it ends.)"""

import json
import os

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult


class FileExporter(SpanExporter):
    def __init__(self, path):
        self.path = path

    def export(self, spans):
        if self.path:
            lines = "".join(json.dumps(json.loads(span.to_json())) + "\n" for span in spans)
            # The worker's children append to one file: one O_APPEND write per batch, so
            # two children's lines never interleave mid-line as buffered writes could.
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
            try:
                os.write(fd, lines.encode())
            finally:
                os.close(fd)
        return SpanExportResult.SUCCESS


def configure():
    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(FileExporter(os.environ.get("OTEL_SPANS_FILE"))))
    trace.set_tracer_provider(provider)
