"""An OTLP/HTTP trace receiver for the tests: no collector installs here.

A small HTTP server that reads what an OTLP/HTTP exporter posts to
``/v1/traces`` with opentelemetry-proto's ``ExportTraceServiceRequest``, as a
collector would, and keeps each request.
"""

import contextlib
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

# One export as it arrived: its path, its content type and what it held.
Export = tuple[str, str, ExportTraceServiceRequest]


@contextlib.contextmanager
def receiving() -> Iterator[tuple[str, list[Export]]]:
    """Serve a receiver on a free port; yield its URL and the exports it got."""
    received: list[Export] = []

    class Receiver(BaseHTTPRequestHandler):
        def do_POST(self):
            body = self.rfile.read(int(self.headers["Content-Length"]))
            request = ExportTraceServiceRequest()
            request.ParseFromString(body)
            received.append((self.path, self.headers["Content-Type"], request))
            answer = ExportTraceServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}", received
    finally:
        server.shutdown()
        server.server_close()


def received_spans(received: list[Export], service: str) -> list:
    """Every span of the exports, each checked to come from ``service``."""
    spans = []
    for _, _, request in received:
        for resource_spans in request.resource_spans:
            resource = {a.key: a.value for a in resource_spans.resource.attributes}
            assert resource["service.name"].string_value == service
            for scope_spans in resource_spans.scope_spans:
                spans.extend(scope_spans.spans)
    return spans
