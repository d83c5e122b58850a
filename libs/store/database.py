"""Connection pools and per-service databases (one PostgreSQL database per service, never shared)."""

from __future__ import annotations

import contextlib
import re
import time
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg
from opentelemetry import trace

from libs.observability.tracing import exporting, tracer

# Types re-exported so that code outside libs/store and services' store.py never imports asyncpg.
Pool = asyncpg.Pool
Connection = asyncpg.Connection
Record = asyncpg.Record

_DB_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")


def with_database(dsn: str, database: str) -> str:
    """The same server DSN pointing at another database."""
    parts = urlsplit(dsn)
    return urlunsplit((parts.scheme, parts.netloc, "/" + database, parts.query, parts.fragment))


def database_name(dsn: str) -> str:
    return urlsplit(dsn).path.lstrip("/") or "postgres"


async def ensure_database(admin_dsn: str, database: str) -> None:
    """Create `database` if missing. Races between services starting at once are harmless."""
    if not _DB_NAME.match(database):
        raise ValueError(f"unsafe database name {database!r}")
    conn = await asyncpg.connect(admin_dsn)
    try:
        exists = await conn.fetchval("SELECT 1 FROM pg_database WHERE datname = $1", database)
        if not exists:
            # a duplicate means another replica created it between our check and our CREATE: fine
            with contextlib.suppress(asyncpg.DuplicateDatabaseError, asyncpg.UniqueViolationError):
                await conn.execute(f'CREATE DATABASE "{database}"')
    finally:
        await conn.close()


async def create_pool(dsn: str, *, min_size: int = 1, max_size: int = 10,
                      reset_session: bool = True) -> asyncpg.Pool:
    """A connection pool; when traces are exported, every query becomes a CLIENT span of the operation that ran
    it (OpenTelemetry database semantic conventions).

    `reset_session=False` skips asyncpg's reset query on every release (`pg_advisory_unlock_all(); CLOSE ALL;
    UNLISTEN *; RESET ALL`), one round trip per unit of work: only for pools whose users leave no session state
    behind (no LISTEN, SET or session-level advisory lock still held at release). An open transaction is still
    rolled back on release either way."""
    init = _trace_queries if exporting() else None
    pool = await asyncpg.create_pool(dsn, min_size=min_size, max_size=max_size, command_timeout=30, init=init,
                                     reset=None if reset_session else _keep_session)
    assert pool is not None
    return pool


async def _keep_session(conn: asyncpg.Connection) -> None:
    """Pool release without the reset query (asyncpg has already rolled back any open transaction)."""


_db_tracer = tracer("gpupool.store")


async def _trace_queries(conn: asyncpg.Connection) -> None:
    conn.add_query_logger(_query_span)


def _query_span(record: Any) -> None:
    """asyncpg reports each query after it ran (scheduled with the caller's context, so the span gets the right
    parent); the span is drawn over the time it took."""
    text = " ".join(str(record.query).split())
    operation = text.split(" ", 1)[0].upper() if text else "QUERY"
    end = time.time_ns()
    params = record.conn_params
    host, port = (record.conn_addr if isinstance(record.conn_addr, tuple) else (str(record.conn_addr), None))
    span = _db_tracer.start_span(
        f"{operation} {getattr(params, 'database', '') or ''}".strip(), kind=trace.SpanKind.CLIENT,
        start_time=end - int(record.elapsed * 1e9),
        attributes={"db.system.name": "postgresql", "db.system": "postgresql", "db.operation.name": operation,
                    "db.namespace": getattr(params, "database", "") or "", "db.query.text": text[:2000],
                    "server.address": str(host), **({"server.port": int(port)} if port else {})})
    if record.exception is not None:
        span.set_status(trace.Status(trace.StatusCode.ERROR, type(record.exception).__name__))
        span.record_exception(record.exception)
    span.end(end_time=end)
