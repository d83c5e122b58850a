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

from libs.contracts import subjects
from libs.contracts.origins import accept
from services.gateway.domain import Action, Principal
from services.gateway.handlers import ERRORS, Caller, require

router = APIRouter(prefix="/v1", responses=ERRORS)

KEEPALIVE_S = 15.0
BUFFER = 1000


def visible(principal: Principal, doc: dict) -> bool:
    """Team-scoped callers see their own team's events and team-less ones (nodes, GPUs); scheduling decisions name
    every team's jobs, so only those who may read decisions see them."""
    if str(doc.get("type", "")).startswith("io.gpupool.decision."):
        return principal.may(Action.DECISION_READ)
    team = (doc.get("data") or {}).get("team")
    return team is None or principal.may(Action.JOB_READ, team)


def matches(doc: dict, types: list[str], team: str | None) -> bool:
    if types and not any(doc.get("type", "").startswith(t) for t in types):
        return False
    return team is None or (doc.get("data") or {}).get("team") == team


@router.get(
    "/events", tags=["events"], summary="Server-sent events: live CloudEvents you may see",
    response_class=StreamingResponse,
    responses={200: {"description": "text/event-stream; each event's `id` is the CloudEvent id, `event` its type",
                     "content": {"text/event-stream": {"schema": {"type": "string"}}}}},
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
    wanted = [t for t in (types or []) if t]
    queue: asyncio.Queue[tuple[str, bytes] | None] = asyncio.Queue(maxsize=BUFFER)

    async def on_msg(msg) -> None:  # type: ignore[no-untyped-def]
        try:
            queue.put_nowait((msg.subject, msg.data))
        except asyncio.QueueFull:
            with contextlib.suppress(asyncio.QueueFull):
                queue.put_nowait(None)  # tell the reader it fell behind

    nc = req.app.state.nc
    subs = [await nc.subscribe(f"{subjects.PREFIX}.{entity}.>", cb=on_msg) for entity in subjects.EVENT_ENTITIES]

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
            for sub in subs:
                with contextlib.suppress(Exception):
                    await sub.unsubscribe()

    return StreamingResponse(body(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
