"""An OTLP/HTTP trace receiver for the tests: no collector installs here.

A small HTTP server that reads what an OTLP/HTTP exporter posts to
``/v1/traces`` with opentelemetry-proto's ``ExportTraceServiceRequest``, as a
collector would, and keeps each request. It keeps connections alive (HTTP/1.1),
as a collector does, so an exporter posts each batch on the same connection.

    python tests/tracing/receiver.py SERVICE

serves one in a process of its own (bench/tracing.py's collector): it prints
its URL, serves until its standard input closes, then prints the spans it got
from SERVICE, counted by the first word of their names, as JSON.
"""

import contextlib
import json
import sys
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
        protocol_version = "HTTP/1.1"

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


def main(service: str) -> None:
    with receiving() as (url, received):
        print(url, flush=True)
        sys.stdin.read()
    counts: dict[str, int] = {}
    for span in received_spans(received, service=service):
        kind = span.name.split(" ")[0]
        counts[kind] = counts.get(kind, 0) + 1
    print(json.dumps(counts), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
