"""Request/reply for commands and queries on core NATS, answered by the owning service's queue group.

Handlers get a validated pydantic command and return a `Reply` (or a plain result, wrapped as success). Invalid
requests get a 400 `InvalidRequest` reply; unexpected exceptions a 500 with a generic message (details stay in the
service log, never leak to callers).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeoutError
from opentelemetry import trace
from pydantic import BaseModel, ValidationError

from libs.contracts.commands import Command, Reply
from libs.observability.metrics import RPC_REQUESTS
from libs.observability.tracing import handling_span, inject_headers, tracer

log = logging.getLogger(__name__)

C = TypeVar("C", bound=Command)
RpcHandler = Callable[[Any], Awaitable[Reply | Any]]


MAX_IN_FLIGHT = 64
RPC_OUTCOMES = ("ok", "refused", "invalid", "error")


async def serve(nc: NATS, subject: str, command: type[C], handler: Callable[[C], Awaitable[Any]],
                *, queue: str, max_in_flight: int = MAX_IN_FLIGHT,
                subject_check: Callable[[str, C], str | None] | None = None) -> Subscription:
    """Answer `subject` in queue group `queue`. Requests are handled concurrently (up to `max_in_flight` at once):
    a subscription's callback runs one message at a time, so a handler waiting on the database or on another
    service would otherwise hold up every request behind it.

    `subject_check(subject, command)`: for a wildcard subject whose tokens name who may send the command (a node's
    registration on `...register_node.<cluster>.<node>`, which only that node's identity may publish): the reason
    to refuse a command that names someone else (403 WrongSubject), or None."""
    tr = tracer("gpupool.rpc")
    name = f"serve {subject}"
    slots = asyncio.Semaphore(max_in_flight)
    in_flight: set[asyncio.Task[None]] = set()
    # outcome -> metric child, looked up once instead of per request; every outcome exists from the start at 0,
    # so a dashboard of refusals and errors shows 0 on a healthy system rather than "No data"
    counted: dict[str, Any] = {o: RPC_REQUESTS.labels(subject=subject, outcome=o) for o in RPC_OUTCOMES}

    async def on_message(msg: Msg) -> None:
        await slots.acquire()  # back-pressure: at the limit, the subscription stops reading until one finishes
        task = asyncio.create_task(handle(msg))
        in_flight.add(task)
        task.add_done_callback(lambda t: (in_flight.discard(t), slots.release()))

    async def handle(msg: Msg) -> None:
        with handling_span(tr, name, msg.headers, trace.SpanKind.SERVER):
            reply, outcome = await answer(msg)
            counter = counted.get(outcome)
            if counter is None:
                counter = counted[outcome] = RPC_REQUESTS.labels(subject=subject, outcome=outcome)
            counter.inc()
            if msg.reply:
                await msg.respond(reply.model_dump_json().encode())

    async def answer(msg: Msg) -> tuple[Reply, str]:
        try:
            cmd = command.model_validate_json(msg.data or b"{}")
        except ValidationError as exc:
            return Reply.failure(400, "InvalidRequest", _validation_message(exc),
                                 errors=json.loads(exc.json(include_url=False, include_input=False))), "invalid"
        refused = subject_check(msg.subject, cmd) if subject_check is not None else None
        if refused is not None:
            log.warning("rpc_wrong_subject", extra={"subject": msg.subject, "reason": refused})
            return Reply.failure(403, "WrongSubject", refused), "refused"
        try:
            result = await handler(cmd)
        except Exception:
            log.exception("rpc_handler_failed", extra={"subject": subject})
            return Reply.failure(500, "InternalError", "the service failed to handle the request"), "error"
        reply = result if isinstance(result, Reply) else Reply.success(_jsonable(result))
        return reply, "ok" if reply.ok else "refused"

    return await nc.subscribe(subject, queue=queue, cb=on_message)


class ServiceUnavailable(RuntimeError):
    """No service answered in time (not running, or overloaded)."""


async def request(nc: NATS, subject: str, cmd: BaseModel, *, timeout: float = 5.0) -> Reply:
    headers: dict[str, str] = {}
    inject_headers(headers)
    try:
        msg = await nc.request(subject, cmd.model_dump_json().encode(), timeout=timeout, headers=headers)
    except (NoRespondersError, NatsTimeoutError) as exc:
        raise ServiceUnavailable(f"no reply on {subject}: {type(exc).__name__}") from exc
    return Reply.model_validate_json(msg.data)


def _jsonable(result: Any) -> Any:
    if isinstance(result, BaseModel):
        return result.model_dump(mode="json")
    if isinstance(result, list):
        return [_jsonable(r) for r in result]
    if isinstance(result, dict):
        return {k: _jsonable(v) for k, v in result.items()}
    return result


def _validation_message(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors()[:5]:
        loc = ".".join(str(p) for p in err.get("loc", ())) or "<body>"
        parts.append(f"{loc}: {err.get('msg')}")
    return "; ".join(parts)
