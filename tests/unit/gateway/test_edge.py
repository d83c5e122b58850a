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


async def test_a_chunked_body_is_read_only_up_to_the_limit_and_replayed_within_it() -> None:
    """Without Content-Length the middleware reads at most the limit before the app (or authentication) runs."""
    from services.gateway.bootstrap import bounded_body

    def feeder(chunks: list[bytes]):  # type: ignore[no-untyped-def]
        pulled = []

        async def receive() -> dict:
            if len(pulled) < len(chunks):
                pulled.append(1)
                return {"type": "http.request", "body": chunks[len(pulled) - 1],
                        "more_body": len(pulled) < len(chunks)}
            return {"type": "http.disconnect"}
        return receive, pulled

    receive, pulled = feeder([b"a" * 40, b"b" * 40, b"c" * 1000, b"never read"])
    assert await bounded_body(receive, 64) is None
    assert len(pulled) == 2, "the chunk that passed the limit is the last one read"
    receive, _ = feeder([b'{"a":', b" 1}"])
    replay = await bounded_body(receive, 64)
    assert await replay() == {"type": "http.request", "body": b'{"a": 1}', "more_body": False}
    assert (await replay())["type"] == "http.disconnect"


def test_every_event_type_is_public_or_names_its_team() -> None:
    """The SSE stream shows an event to a team-scoped caller only by its `team`: a new event type about a team's
    work that forgot the field would be hidden from that team, one declared public is shown to everyone."""
    from libs.contracts.events import EventData
    from services.gateway.events import DECISION_TYPES, PUBLIC_TYPES

    def subclasses(cls: type) -> list[type]:
        return [c for sub in cls.__subclasses__() for c in (sub, *subclasses(sub))]

    kinds = [c for c in subclasses(EventData) if "event_type" in c.__dict__]
    assert len(kinds) > 30
    for kind in kinds:
        public = kind.event_type.startswith(PUBLIC_TYPES) or kind.event_type.startswith(DECISION_TYPES)
        assert public or "team" in kind.model_fields, f"{kind.event_type} neither public nor carrying team"


def test_visibility_of_events_by_role_and_team() -> None:
    from services.gateway.domain import Principal
    from services.gateway.events import visible

    member = Principal(subject="m", role="member", team="research", via="token", token_id="t1")
    teamless = Principal(subject="o", role="member", team=None, via="oidc")
    operator = Principal(subject="op", role="operator", team=None, via="token", token_id="t2")
    ours = {"type": "io.gpupool.job.started.v1", "data": {"team": "research"}}
    theirs = {"type": "io.gpupool.job.started.v1", "data": {"team": "inference"}}
    unnamed = {"type": "io.gpupool.job.started.v1", "data": {"job_id": "j"}}  # from before team was carried
    node = {"type": "io.gpupool.node.registered.v1", "data": {}}
    decision = {"type": "io.gpupool.decision.cycle.v1", "data": {}}
    assert [visible(member, d) for d in (ours, theirs, unnamed, node, decision)] == [True, False, False, True, False]
    assert [visible(teamless, d) for d in (ours, theirs, unnamed, node)] == [False, False, False, True]
    assert all(visible(operator, d) for d in (ours, theirs, unnamed, node, decision))
