"""The gateway's edge middleware with spans not exported: the trace context is still continued, propagated (what
the routes' NATS requests carry) and echoed; oversized bodies and NUL in the URL are refused with problem bodies."""

from __future__ import annotations

import json

import pytest

from libs.observability import tracing
from libs.observability.tracing import current_traceparent, recording
from services.gateway.bootstrap import HTTP_REQUESTS, EdgeMiddleware


@pytest.fixture(autouse=True)
def nothing_listens(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests are about the path taken when no span processor listens; an integration test earlier in the same
    session may have added one to the process's provider."""
    monkeypatch.setattr(tracing, "_provider", None)

CALLER = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


class App:
    """A route that records the traceparent its outgoing requests would carry."""

    def __init__(self) -> None:
        self.seen: list[str | None] = []

    async def __call__(self, scope: dict, receive, send) -> None:  # type: ignore[no-untyped-def]
        self.seen.append(current_traceparent())
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
        await send({"type": "http.response.body", "body": b"ok"})


async def call(edge: EdgeMiddleware, path: str = "/v1/x", headers: list[tuple[bytes, bytes]] = (),
               query: bytes = b"") -> tuple[int, dict[bytes, bytes], bytes]:
    sent: list[dict] = []

    async def receive() -> dict:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "GET", "path": path, "query_string": query, "headers": list(headers)}
    await edge(scope, receive, send)
    start = next(m for m in sent if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return start["status"], dict(start["headers"]), body


async def test_a_callers_trace_is_continued_propagated_and_echoed() -> None:
    app = App()
    edge = EdgeMiddleware(app, max_body_bytes=100)
    assert not recording()  # nothing receives spans in the unit tests
    status, headers, _ = await call(edge, headers=[(b"traceparent", CALLER.encode())])
    echoed = headers[b"traceparent"].decode()
    version, trace_id, span_id, flags = echoed.split("-")
    assert (version, trace_id, flags) == ("00", CALLER.split("-")[1], "01")
    assert span_id != CALLER.split("-")[2] and int(span_id, 16) != 0  # the gateway's own span, a child
    assert app.seen == [echoed]  # what the request's NATS calls carry


async def test_without_a_caller_trace_each_request_starts_its_own() -> None:
    app = App()
    edge = EdgeMiddleware(app, max_body_bytes=100)
    first = (await call(edge))[1][b"traceparent"].decode()
    second = (await call(edge, headers=[(b"traceparent", b"garbage")]))[1][b"traceparent"].decode()
    assert first.split("-")[1] != second.split("-")[1]
    assert all(int(t.split("-")[1], 16) != 0 and t.endswith("-01") for t in (first, second))
    assert app.seen == [first, second]


async def test_unsampled_callers_stay_unsampled() -> None:
    app = App()
    edge = EdgeMiddleware(app, max_body_bytes=100)
    unsampled = CALLER[:-2] + "00"
    echoed = (await call(edge, headers=[(b"traceparent", unsampled.encode())]))[1][b"traceparent"].decode()
    assert echoed.split("-")[1] == CALLER.split("-")[1] and echoed.endswith("-00")


async def test_oversized_bodies_and_nul_in_the_url_get_problem_bodies() -> None:
    app = App()
    edge = EdgeMiddleware(app, max_body_bytes=100)
    status, headers, body = await call(edge, headers=[(b"content-length", b"101")])
    assert status == 413 and json.loads(body)["reason"] == "PayloadTooLarge"
    assert headers[b"content-type"] == b"application/problem+json"
    status, _, body = await call(edge, headers=[(b"content-length", b"12x")])
    assert status == 413
    status, _, body = await call(edge, query=b"a=%00")
    assert status == 400 and json.loads(body)["reason"] == "InvalidRequest"
    assert app.seen == []  # none reached the app
    assert (await call(edge, headers=[(b"content-length", b"100")]))[0] == 200


async def test_requests_are_counted_by_route_and_status() -> None:
    edge = EdgeMiddleware(App(), max_body_bytes=100)
    counter = HTTP_REQUESTS.labels("GET", "unmatched", "200")
    before = counter._value.get()
    for _ in range(3):
        await call(edge)
    assert counter._value.get() == before + 3
