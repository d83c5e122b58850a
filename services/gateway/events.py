"""`GET /v1/events`: a server-sent-events stream of the platform's CloudEvents a caller may see.

Live only: it relays what is published while the stream is open (a core-NATS subscription per connection, bounded
so a slow reader cannot grow the gateway's memory). Systems that need every event durably consume JetStream
directly; this stream is for dashboards, CLIs and people watching.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import APIRouter, Query, Request
from fastapi.responses import StreamingResponse
from starlette.background import BackgroundTask

from libs.contracts import subjects
from libs.contracts.origins import accept
from services.gateway.domain import ANY, Action, Principal
from services.gateway.handlers import ERRORS, ApiError, Caller, require

router = APIRouter(prefix="/v1", responses=ERRORS)

KEEPALIVE_S = 15.0
BUFFER = 1000

# One server-sent event, as OpenAPI 3.1 describes an event stream (`schema` is each event; OpenAPI 3.2 would call
# it `itemSchema`): `data` is one CloudEvent in structured JSON mode, or the closing `overflow` event's detail.
# Comments (`: keepalive`) are no events.
SSE_EVENT: dict = {
    "type": "object", "required": ["event", "data"],
    "properties": {
        "id": {"type": "string", "description": "the CloudEvent's id (empty for `overflow`)"},
        "event": {"type": "string", "description": "the CloudEvent's type, or `overflow`: the reader fell behind "
                                                   "and the stream ends; reconnect"},
        "data": {"type": "string", "contentMediaType": "application/json", "contentSchema": {"anyOf": [
            {"type": "object", "required": ["specversion", "id", "source", "type"],
             "properties": {"specversion": {"const": "1.0"}, "id": {"type": "string"},
                            "source": {"type": "string"}, "type": {"type": "string"}}},
            {"type": "object", "required": ["detail"], "properties": {"detail": {"type": "string"}}}]}},
    },
}


# Events about the pool or platform-wide policy, which every caller may read (`POOL_READ`, `TEAM_READ`). Every
# other event is about a team's work and is shown only to those who may read that team's jobs: it must carry
# `team`, and one without (an event from before it was carried) goes only to platform-wide readers. A unit test
# holds every event type to one of the two.
PUBLIC_TYPES = ("io.gpupool.node.", "io.gpupool.gpu.health_changed.", "io.gpupool.gpu.sharing_set.",
                "io.gpupool.telemetry.", "io.gpupool.quota.set.", "io.gpupool.quota.priority_class_set.",
                "io.gpupool.quota.team_created.", "io.gpupool.usage.rate_set.")
DECISION_TYPES = "io.gpupool.decision."


def visible(principal: Principal, doc: dict) -> bool:
    """Decisions name every team's jobs: only those who may read decisions see them. Public types go to everyone;
    the rest only to callers who may read the team the event names."""
    kind = str(doc.get("type", ""))
    if kind.startswith(DECISION_TYPES):
        return principal.may(Action.DECISION_READ)
    if kind.startswith(PUBLIC_TYPES) or principal.scope(Action.JOB_READ) == ANY:
        return True
    data = doc.get("data")
    team = data.get("team") if isinstance(data, dict) else None
    return isinstance(team, str) and principal.may(Action.JOB_READ, team)


def matches(doc: dict, types: list[str], team: str | None) -> bool:
    if types and not any(doc.get("type", "").startswith(t) for t in types):
        return False
    return team is None or (doc.get("data") or {}).get("team") == team


class StreamSlots:
    """How many event streams each caller has open: beyond `limit` a new one is refused (429), so one token cannot
    hold hundreds of subscriptions and connections."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.open: dict[str, int] = {}

    def take(self, who: str) -> bool:
        if self.open.get(who, 0) >= self.limit:
            return False
        self.open[who] = self.open.get(who, 0) + 1
        return True

    def give_back(self, who: str) -> None:
        left = self.open.get(who, 0) - 1
        if left > 0:
            self.open[who] = left
        else:
            self.open.pop(who, None)


@router.get(
    "/events", tags=["events"], summary="Server-sent events: live CloudEvents you may see",
    response_class=StreamingResponse,
    responses={200: {"description": "text/event-stream; each event's `id` is the CloudEvent id, `event` its type",
                     "content": {"text/event-stream": {"schema": SSE_EVENT}}}},
)
async def stream_events(
    req: Request, caller: Caller,
    types: Annotated[list[str] | None, Query(alias="type", max_length=20,
                                             description="CloudEvents type prefixes, e.g. io.gpupool.allocation")] = None,
    team: Annotated[str | None, Query(max_length=63)] = None,
    max_seconds: Annotated[int, Query(ge=1, le=3600, description="Close after this long; reconnect to go on")] = 900,
) -> StreamingResponse:
    require(caller, Action.POOL_READ)
    if team is not None:
        require(caller, Action.JOB_READ, team)
    slots: StreamSlots = req.app.state.event_streams
    if not slots.take(caller.identity):
        raise ApiError(429, "TooManyStreams", f"at most {slots.limit} event streams may be open per caller; close "
                                              f"one first", headers={"Retry-After": "5"})
    wanted = [t for t in (types or []) if t]
    queue: asyncio.Queue[tuple[str, bytes] | None] = asyncio.Queue(maxsize=BUFFER)

    async def on_msg(msg) -> None:  # type: ignore[no-untyped-def]
        try:
            queue.put_nowait((msg.subject, msg.data))
        except asyncio.QueueFull:
            with contextlib.suppress(asyncio.QueueFull):
                queue.put_nowait(None)  # tell the reader it fell behind

    nc = req.app.state.nc
    subs: list = []
    closed = False

    async def close() -> None:
        """Once, whichever comes first: the body's end, or the response's end without the body ever starting."""
        nonlocal closed
        if closed:
            return
        closed = True
        slots.give_back(caller.identity)
        for sub in subs:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()

    try:
        for entity in subjects.EVENT_ENTITIES:
            subs.append(await nc.subscribe(f"{subjects.PREFIX}.{entity}.>", cb=on_msg))
    except BaseException:
        await close()
        raise

    async def body() -> AsyncIterator[bytes]:
        deadline = time.monotonic() + max_seconds
        try:
            yield b": gpupool event stream\n\n"
            while (remaining := deadline - time.monotonic()) > 0:
                if await req.is_disconnected():
                    return
                try:
                    item = await asyncio.wait_for(queue.get(), timeout=min(KEEPALIVE_S, remaining))
                except TimeoutError:
                    yield b": keepalive\n\n"
                    continue
                if item is None:
                    yield b"event: overflow\ndata: {\"detail\": \"reader fell behind; reconnect\"}\n\n"
                    return
                subject, raw = item
                try:
                    accept(raw, subject)  # what consumers would refuse (a forgery, poison) no caller sees either
                    doc = json.loads(raw)
                except ValueError:
                    continue
                if not visible(caller, doc) or not matches(doc, wanted, team):
                    continue
                yield f"id: {doc.get('id', '')}\nevent: {doc.get('type', 'message')}\ndata: ".encode() + raw + b"\n\n"
        finally:
            await close()

    return StreamingResponse(body(), media_type="text/event-stream", background=BackgroundTask(close),
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
