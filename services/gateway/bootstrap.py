"""Composition root of the gateway: settings → NATS connection → FastAPI app with problem-details errors."""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, get_args

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_fields_from_routes
from fastapi.responses import JSONResponse, Response
from fastapi.routing import APIRoute
from opentelemetry import trace
from prometheus_client import CONTENT_TYPE_LATEST, Counter, generate_latest
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from libs.bus.connection import connect, identity_inbox
from libs.bus.rpc import ServiceUnavailable, request
from libs.contracts import subjects
from libs.contracts.api import Readiness
from libs.contracts.api_pages import Health
from libs.contracts.commands import Empty
from libs.observability.logging import setup_logging
from libs.observability.tracing import child_span, extract_context, recording, setup_tracing, tracer
from libs.runtime.http import inherited_socket
from libs.store.database import create_pool, database_name, ensure_database, with_database
from libs.store.migrations import migrate, package_migrations, store_migrations
from services.gateway.auth import Authenticator
from services.gateway.config import GatewaySettings
from services.gateway.decisions import router as decisions_router
from services.gateway.endpoints import router as endpoints_router
from services.gateway.events import StreamSlots
from services.gateway.events import router as events_router
from services.gateway.handlers import ApiError, Problem, returns, router
from services.gateway.logs import router as logs_router
from services.gateway.malformed import protocol_class
from services.gateway.nodes import router as nodes_router
from services.gateway.policy import router as policy_router
from services.gateway.problems import problem
from services.gateway.reports import router as reports_router
from services.gateway.ui import router as ui_router
from services.gateway.utilization import router as utilization_router

log = logging.getLogger(__name__)
HTTP_REQUESTS = Counter("gpupool_gateway_requests_total", "HTTP requests", ["method", "route", "status"])
BACKENDS = ("inventory", "quota", "queue", "placement", "reclamation", "accounting")


# FastAPI ≥ 0.16x traces and meters every request itself; the gateway's own span (EdgeMiddleware) is the one the
# platform's traces are built on, so the second, native layer is switched off where it exists.
_NO_NATIVE_TELEMETRY: dict[str, Any] = (
    {"telemetry": {"tracing": False, "metrics": False, "logs": False, "operation_spans": False}}
    if "telemetry" in inspect.signature(FastAPI.__init__).parameters else {})


class EdgeMiddleware:
    """What every request goes through first, as one plain ASGI middleware (Starlette's `@app.middleware("http")`
    costs a task group and a streaming bridge per request and layer): refuse NUL in the URL and oversized bodies
    with problem bodies, open one SERVER span per request (continuing a caller's traceparent, echoed back in the
    response), count requests by route and status.

    When no span processor listens (`recording()`), the span is a non-recording one: the same trace context (the
    caller's trace id or a new one, a new span id, sampled) is still propagated over NATS and echoed back, without
    the SDK's span object, attributes and processors on every request."""

    def __init__(self, app: Any, max_body_bytes: int) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.tracer = tracer("gpupool.gateway")
        self.counters: dict[tuple[str, str, str], Any] = {}  # label lookups cost more than the increment

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path, query = scope.get("path", ""), scope.get("query_string", b"")
        if "\x00" in path or b"%00" in query or b"\x00" in query:
            await problem(400, "InvalidRequest", "NUL characters are not allowed in the URL", instance="/")(
                scope, receive, send)
            return
        length: str | None = None
        chunked = False
        carrier: dict[str, str] = {}
        for key, value in scope.get("headers", ()):
            if key == b"content-length":
                length = value.decode("latin-1")
            elif key == b"transfer-encoding":
                chunked = True
            elif key in _TRACE_HEADERS:
                carrier[key.decode("latin-1")] = value.decode("latin-1")
        too_large = problem(413, "PayloadTooLarge", f"request bodies are limited to {self.max_body_bytes} bytes",
                            instance=path)
        if length is not None and (not length.isdigit() or int(length) > self.max_body_bytes):
            await too_large(scope, receive, send)
            return
        if chunked and length is None:
            # no declared length: read at most the limit here, before any route (or authentication) runs
            receive = await bounded_body(receive, self.max_body_bytes)
            if receive is None:
                await too_large(scope, _disconnected, send)
                return
        method = scope.get("method", "GET")
        status = 500
        if recording():
            span_cm: Any = self.tracer.start_as_current_span(
                f"{method} {path}", context=extract_context(carrier), kind=trace.SpanKind.SERVER,
                attributes={"http.request.method": method, "url.path": path})
        else:
            span_cm = trace.use_span(child_span(carrier), end_on_exit=False)
        with span_cm as span:
            ctx = span.get_span_context()
            traceparent = f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}".encode()

            async def send_with_trace(message: dict) -> None:
                nonlocal status
                if message["type"] == "http.response.start":
                    status = message["status"]
                    message = {**message, "headers": [*message.get("headers", []), (b"traceparent", traceparent)]}
                await send(message)

            try:
                await self.app(scope, receive, send_with_trace)
            finally:
                route = getattr(scope.get("route"), "path", "unmatched")
                if span.is_recording():
                    span.update_name(f"{method} {route}")
                    span.set_attribute("http.route", route)
                    span.set_attribute("http.response.status_code", status)
                key = (method, route, str(status))
                counter = self.counters.get(key)
                if counter is None:
                    counter = self.counters[key] = HTTP_REQUESTS.labels(*key)
                counter.inc()


_TRACE_HEADERS = frozenset({b"traceparent", b"tracestate"})


async def bounded_body(receive: Any, limit: int) -> Any:
    """Read a body of undeclared length (chunked) whole while it stays within `limit` bytes, and return a
    `receive` that replays it; None as soon as it passes the limit (the rest is never read or kept)."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":  # the client went away: let the app see that
            first: dict | None = message
            break
        body = message.get("body", b"")
        size += len(body)
        if size > limit:
            return None
        chunks.append(body)
        if not message.get("more_body", False):
            first = {"type": "http.request", "body": b"".join(chunks), "more_body": False}
            break

    async def replay() -> dict:
        nonlocal first
        if first is not None:
            message, first = first, None
            return message
        return await receive()

    return replay


async def _disconnected() -> dict:
    return {"type": "http.disconnect"}


def operation_id(route: APIRoute) -> str:
    """A readable operationId, the route function's name in camelCase (`submit_job` -> `submitJob`), instead of
    FastAPI's `submit_job_v1_jobs_post`: client generators name their methods after it."""
    head, *rest = route.name.split("_")
    return head + "".join(w[:1].upper() + w[1:] for w in rest)


def with_problem_component(app: FastAPI) -> None:
    """The RFC 9457 `Problem` schema as one component, which every error response refers to; and each component's
    `examples` as its model wrote them (FastAPI drops every null from the document, which left examples without
    the required, nullable fields they set to null, e.g. a report's `team`)."""
    plain = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schemas = plain().setdefault("components", {}).setdefault("schemas", {})
            schemas["Problem"] = Problem.model_json_schema(ref_template="#/components/schemas/{model}")
            for model in _documented_models(app):
                extra = model.model_config.get("json_schema_extra")
                if isinstance(extra, dict) and extra.get("examples") and model.__name__ in schemas:
                    schemas[model.__name__]["examples"] = json.loads(json.dumps(extra["examples"], default=str))
            _no_nul_anywhere(app.openapi_schema)
        return app.openapi_schema  # type: ignore[return-value]

    app.openapi = openapi  # type: ignore[method-assign]


NO_NUL = "^[^\\x00]*$"


def _no_nul_anywhere(document: dict[str, Any]) -> None:
    """NUL is refused everywhere a caller can put text: in the URL by `EdgeMiddleware` (400), in a body by every
    command (`Command._no_nul_characters`, 422; PostgreSQL text cannot hold it). Every path or query parameter and
    every component a request body reaches says so: each string without a pattern of its own (a pattern of its own
    never admits NUL) gets `NO_NUL`, each map's keys too."""
    schemas = document.get("components", {}).get("schemas", {})
    todo: list[Any] = []
    for item in document["paths"].values():
        for operation in item.values():
            todo += [p.get("schema", {}) for p in operation.get("parameters", ()) if p.get("in") in ("path", "query")]
            todo += [c.get("schema", {}) for c in operation.get("requestBody", {}).get("content", {}).values()]
    seen: set[int] = set()
    while todo:
        schema = todo.pop()
        if not isinstance(schema, dict) or id(schema) in seen:
            continue
        seen.add(id(schema))
        ref = schema.get("$ref", "")
        if ref.startswith("#/components/schemas/"):
            todo.append(schemas.get(ref.rsplit("/", 1)[1]))
        todo += [*schema.get("anyOf", ()), *schema.get("allOf", ()), *schema.get("properties", {}).values(),
                 schema.get("items"), schema.get("additionalProperties")]
        if schema.get("type") == "object" and isinstance(schema.get("additionalProperties"), dict):
            schema.setdefault("propertyNames", {"pattern": NO_NUL})
        if schema.get("type") == "string" and not {"pattern", "enum", "const", "format"} & set(schema):
            schema["pattern"] = NO_NUL


def _documented_models(app: FastAPI) -> set[type[BaseModel]]:
    """The models the document is built from (FastAPI's own walk over the routes: bodies, parameters, responses),
    and the models their fields name."""
    found: set[type[BaseModel]] = set()
    todo: list[Any] = [f.field_info.annotation for f in get_fields_from_routes(list(app.routes))]
    while todo:
        item = todo.pop()
        for model in _models_in(item):
            if model not in found:
                found.add(model)
                todo += [f.annotation for f in model.model_fields.values()]
    return found


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in get_args(annotation) for m in _models_in(arg)]


def allowed_methods(app: FastAPI, path: str) -> str | None:
    """Every method the document declares on the paths `path` matches (HEAD with GET, as Starlette serves it);
    None for a path the document does not describe. Starlette's own `Allow` names only the first route that
    matched the path (GET /v1/jobs, not its POST)."""
    table = getattr(app.state, "allow_table", None)
    if table is None:
        table = app.state.allow_table = [
            (re.compile("^" + "[^/]+".join(re.escape(part) for part in re.split(r"\{[^/}]+\}", template)) + "$"),
             {method.upper() for method in item}) for template, item in app.openapi()["paths"].items()]
    methods: set[str] = set().union(*(declared for pattern, declared in table if pattern.match(path)))
    if "GET" in methods:
        methods.add("HEAD")
    return ", ".join(sorted(methods)) or None


def add_problem_handlers(app: FastAPI) -> None:
    """Every error the gateway answers as an RFC 9457 problem: refusals of the services, a backing service that
    did not answer, invalid requests, unknown routes and methods, and a crash (logged, never shown)."""

    @app.exception_handler(ApiError)
    async def on_api_error(req: Request, exc: ApiError) -> JSONResponse:
        headers = exc.headers
        if exc.status in (429, 503) and isinstance(exc.extensions.get("retry_after_s"), int):
            headers = {**(headers or {}), "Retry-After": str(exc.extensions["retry_after_s"])}  # a service's hint
        return problem(exc.status, exc.reason, exc.detail, instance=req.url.path, headers=headers,
                       **exc.extensions)

    @app.exception_handler(ServiceUnavailable)
    async def on_unavailable(req: Request, exc: ServiceUnavailable) -> JSONResponse:
        return problem(503, "ServiceUnavailable", "a backing service did not answer in time; retry later",
                       instance=req.url.path)

    @app.exception_handler(RequestValidationError)
    async def on_invalid(req: Request, exc: RequestValidationError) -> JSONResponse:
        errors = [{"loc": list(e.get("loc", ())), "msg": e.get("msg"), "type": e.get("type")} for e in exc.errors()]
        first = errors[0] if errors else {"loc": [], "msg": "invalid request"}
        detail = f"{'.'.join(str(p) for p in first['loc'])}: {first['msg']}"
        return problem(422, "InvalidRequest", detail, instance=req.url.path, errors=errors[:20])

    @app.exception_handler(ValidationError)
    async def on_command_invalid(req: Request, exc: ValidationError) -> JSONResponse:
        """A command the gateway built from valid-looking input still failed the contract's rules."""
        first = exc.errors()[0]
        detail = f"{'.'.join(str(p) for p in first.get('loc', ())) or 'request'}: {first.get('msg')}"
        return problem(422, "InvalidRequest", detail, instance=req.url.path)

    @app.exception_handler(StarletteHTTPException)
    async def on_http(req: Request, exc: StarletteHTTPException) -> JSONResponse:
        reason = {404: "NotFound", 405: "MethodNotAllowed"}.get(exc.status_code, "HttpError")
        headers = exc.headers
        if exc.status_code == 405:  # RFC 9110: a 405 names the methods the resource has
            allow = allowed_methods(req.app, req.url.path)
            headers = {"Allow": allow} if allow else headers
        return problem(exc.status_code, reason, str(exc.detail), instance=req.url.path, headers=headers)

    @app.exception_handler(Exception)
    async def on_crash(req: Request, exc: Exception) -> JSONResponse:
        log.exception("gateway_unhandled_error", extra={"path": req.url.path})
        return problem(500, "InternalError", "the gateway failed to handle the request", instance=req.url.path)



def create_app(settings: GatewaySettings) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        app.state.nc = await connect(settings.nats_url, "gpupool-gateway", user=settings.nats_user,
                                     password=settings.nats_password, nkey_file=settings.nats_nkey_file,
                                     inbox_prefix=identity_inbox("gateway", settings.nats_inbox_prefix,
                                                                 settings.nats_nkey_file))
        dsn = settings.database_url
        await ensure_database(with_database(dsn, "postgres"), database_name(dsn), dsn)
        app.state.pool = await create_pool(dsn, max_size=20)
        await migrate(app.state.pool, store_migrations() + package_migrations("gateway", "services.gateway"))
        app.state.authenticator = Authenticator(settings, app.state.pool)
        await app.state.authenticator.start()
        try:
            yield
        finally:
            await app.state.authenticator.close()
            await app.state.nc.drain()
            await app.state.pool.close()

    app = FastAPI(
        title="gpupool API",
        version="0.1.0",
        summary="One governed, shared GPU pool: jobs, nodes, allocations, quotas, usage.",
        license_info={"name": "Apache-2.0", "identifier": "Apache-2.0"},
        servers=[{"url": "/", "description": "this gateway"}],
        generate_unique_id_function=operation_id,
        lifespan=lifespan,
        **_NO_NATIVE_TELEMETRY,
    )
    with_problem_component(app)
    app.state.settings = settings
    app.state.event_streams = StreamSlots(settings.max_event_streams)
    app.include_router(router)
    app.include_router(logs_router)
    app.include_router(endpoints_router)
    app.include_router(events_router)
    app.include_router(policy_router)
    app.include_router(reports_router)
    app.include_router(nodes_router)
    app.include_router(decisions_router)
    app.include_router(utilization_router)
    app.include_router(ui_router)

    add_problem_handlers(app)
    app.add_middleware(EdgeMiddleware, max_body_bytes=settings.max_body_bytes)

    # the probes need no token (`security: []`): a load balancer or kubelet calls them
    @app.get("/healthz", tags=["ops"], summary="The gateway process is alive", openapi_extra={"security": []},
             **returns(Health))
    async def healthz() -> dict:
        return {"status": "ok"}

    @app.get("/readyz", tags=["ops"], summary="NATS is connected and every service answers on the bus",
             openapi_extra={"security": []}, **returns(Readiness, more={503: {
                 "model": Readiness, "description": "Not ready: the body says which service did not answer"}}))
    async def readyz(req: Request) -> JSONResponse:
        async def ping(service: str) -> bool:
            try:
                reply = await request(req.app.state.nc, subjects.health_ping(service), Empty(), timeout=1.0)
                return reply.ok
            except ServiceUnavailable:
                return False

        results = await asyncio.gather(*(ping(s) for s in BACKENDS))
        services = dict(zip(BACKENDS, results, strict=True))
        ok = req.app.state.nc.is_connected and all(results)
        return JSONResponse({"status": "ready" if ok else "not ready", "services": services},
                            status_code=200 if ok else 503)

    @app.get("/metrics", tags=["ops"], summary="Prometheus metrics", include_in_schema=False)
    async def metrics() -> Response:
        return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)

    return app


def main() -> None:
    import uvicorn

    settings = GatewaySettings()
    setup_logging("gateway", settings.log_level)
    setup_tracing("gateway")
    config = uvicorn.Config(create_app(settings), host=settings.http_host, port=settings.port, log_config=None,
                            access_log=False, timeout_graceful_shutdown=10, http=protocol_class())
    # `gpupool up` hands down the API's listening socket (bound before any service started, so no other process
    # can take the port meanwhile, and the same across restarts): serve on it instead of binding host:port
    sockets = [inherited_socket(settings.http_fd)] if settings.http_fd is not None else None
    uvicorn.Server(config).run(sockets=sockets)
