"""One job, one trace: with an OTLP exporter pointed at a local receiver, the spans of the gateway, quota, queue and
placement for one submission share one trace id, and every parent link points at a span of that trace."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

pytestmark = pytest.mark.e2e


class Receiver:
    """A minimal OTLP/HTTP trace receiver (protobuf), collecting (service, name, trace id, span id, parent id)."""

    def __init__(self) -> None:
        self.spans: list[dict] = []
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                request = ExportTraceServiceRequest()
                request.ParseFromString(body)
                with receiver.lock:
                    for resource_spans in request.resource_spans:
                        service = next((a.value.string_value for a in resource_spans.resource.attributes
                                        if a.key == "service.name"), "?")
                        for scope in resource_spans.scope_spans:
                            for span in scope.spans:
                                receiver.spans.append({
                                    "service": service, "name": span.name, "trace_id": span.trace_id.hex(),
                                    "span_id": span.span_id.hex(), "parent": span.parent_span_id.hex() or None})
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def trace(self, trace_id: str) -> list[dict]:
        with self.lock:
            return [s for s in self.spans if s["trace_id"] == trace_id]


_receiver = Receiver()
# `gpupool up` passes OTEL_* through to every service: export there, quickly.
UP_ENV = {"OTEL_EXPORTER_OTLP_ENDPOINT": _receiver.endpoint, "OTEL_BSP_SCHEDULE_DELAY": "200"}


@pytest.fixture(scope="module", autouse=True)
def otlp_env() -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in UP_ENV}
    os.environ.update(UP_ENV)
    yield
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


def test_one_submission_is_one_trace_across_gateway_quota_queue_and_placement(otlp_env, platform) -> None:  # type: ignore[no-untyped-def]
    with platform.client() as api:
        response = api.post("/v1/jobs", json={"name": "traced", "team": "research", "gpus": 1})
        assert response.status_code == 201
        trace_id = response.headers["traceparent"].split("-")[1]
        job_id = response.json()["job_id"]
        deadline = time.monotonic() + 30
        while api.get(f"/v1/jobs/{job_id}").json()["state"] != "running" and time.monotonic() < deadline:
            time.sleep(0.1)

    wanted = {"gpupool-gateway", "gpupool-quota", "gpupool-queue", "gpupool-placement"}
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        # spans arrive in per-process batches, a parent often after its children: wait for a closed tree
        spans = _receiver.trace(trace_id)
        ids = {s["span_id"] for s in spans}
        dangling = [s for s in spans if s["parent"] is not None and s["parent"] not in ids]
        if wanted <= {s["service"] for s in spans} and any(s["name"] == "place job" for s in spans) \
                and not dangling:
            break
        time.sleep(0.2)
    spans = _receiver.trace(trace_id)
    services = {s["service"] for s in spans}
    assert wanted <= services, f"services in the trace: {sorted(services)}"
    ids = {s["span_id"] for s in spans}
    roots = [s for s in spans if s["parent"] is None or s["parent"] not in ids]
    assert [r["service"] for r in roots] == ["gpupool-gateway"], f"roots: {roots}"
    assert all(s["parent"] in ids for s in spans if s not in roots)
    names = {(s["service"], s["name"]) for s in spans}
    assert ("gpupool-quota", "serve gpupool.cmd.quota.admit") in names
    assert ("gpupool-queue", "serve gpupool.cmd.queue.submit_job") in names
    assert ("gpupool-placement", "consume gpupool.job.submitted") in names
    assert ("gpupool-placement", "place job") in names
    # database calls are spans too, inside the operation that made them: the queue's insert of the job, and
    # placement's insert of the allocation in the transaction of `place job`
    by_id = {s["span_id"]: s for s in spans}
    db = [s for s in spans if s["name"].startswith(("INSERT ", "SELECT ", "UPDATE ", "BEGIN", "COMMIT"))]
    assert any(s["service"] == "gpupool-queue" and s["name"].startswith("INSERT ") for s in db), sorted(names)
    placed = [s for s in db if s["service"] == "gpupool-placement" and s["name"].startswith("INSERT ")
              and by_id[s["parent"]]["name"] == "place job"]
    assert placed, sorted(n for n in names if n[0] == "gpupool-placement")
