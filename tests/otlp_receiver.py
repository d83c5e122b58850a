"""A minimal OTLP/HTTP trace receiver for tests: a real HTTP server the OpenTelemetry SDK's OTLP exporter posts to
(`POST /v1/traces`, protobuf `ExportTraceServiceRequest`, decoded with `opentelemetry-proto`). It keeps every span
it received with its service, name, ids, parent, links and attributes.

The OpenTelemetry Collector itself is not packaged on PyPI, Debian or npm (docs/ecosystem.md, "Traces: OTLP"), so
this is the receiver the ecosystem check runs against: the exporter, its encoding and its transport are the real
ones; only what a collector would do with the spans afterwards is left out."""

from __future__ import annotations

import gzip
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)


def _value(v: Any) -> Any:
    kind = v.WhichOneof("value")
    return getattr(v, kind) if kind in ("string_value", "int_value", "bool_value", "double_value") else None


class OtlpReceiver:
    """Collects spans posted to `<endpoint>/v1/traces`; `endpoint` is what OTEL_EXPORTER_OTLP_ENDPOINT names."""

    def __init__(self) -> None:
        self.spans: list[dict[str, Any]] = []
        self.requests = 0
        self.rejected = 0
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                if self.path != "/v1/traces" or self.headers.get("Content-Type") != "application/x-protobuf":
                    with receiver.lock:
                        receiver.rejected += 1
                    self.send_response(404 if self.path != "/v1/traces" else 415)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                request = ExportTraceServiceRequest()
                request.ParseFromString(body)
                receiver.add(request)
                reply = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def add(self, request: ExportTraceServiceRequest) -> None:
        now = time.monotonic()
        with self.lock:
            self.requests += 1
            for resource_spans in request.resource_spans:
                service = next((a.value.string_value for a in resource_spans.resource.attributes
                                if a.key == "service.name"), "?")
                for scope in resource_spans.scope_spans:
                    for span in scope.spans:
                        self.spans.append({
                            "service": service, "scope": scope.scope.name, "name": span.name,
                            "trace_id": span.trace_id.hex(), "span_id": span.span_id.hex(),
                            "parent": span.parent_span_id.hex() or None, "received": now,
                            "links": [(link.trace_id.hex(), link.span_id.hex()) for link in span.links],
                            "attributes": {a.key: _value(a.value) for a in span.attributes}})

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def all(self) -> list[dict[str, Any]]:
        with self.lock:
            return list(self.spans)

    def trace(self, trace_id: str) -> list[dict[str, Any]]:
        return [s for s in self.all() if s["trace_id"] == trace_id]

    def since(self, mark: float) -> list[dict[str, Any]]:
        return [s for s in self.all() if s["received"] >= mark]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def breakdown(spans: list[dict[str, Any]], top: int = 15) -> str:
    """The most frequent (service, span name, root?) triples: what a noise report shows."""
    counts = Counter((s["service"], s["name"], s["parent"] is None) for s in spans)
    return "\n".join(f"{n:6d}  {svc} {name!r}{' (root)' if root else ''}" for (svc, name, root), n
                     in counts.most_common(top))
