"""Connection pools and per-service databases (one PostgreSQL database per service, never shared)."""

from __future__ import annotations

import contextlib
import re
import time
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg
from opentelemetry import trace

from libs.observability.tracing import exporting, in_recorded_span, tracer

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


async def ensure_database(admin_dsn: str, database: str, dsn: str | None = None) -> None:
    """Create `database` if missing. With `dsn` (the service's own DSN to it), a database that exists is found by
    connecting to it as the service, which needs no right on any other database: a service whose role owns only
    its database never connects to `postgres`. Races between services starting at once are harmless."""
    if not _DB_NAME.match(database):
        raise ValueError(f"unsafe database name {database!r}")
    if dsn is not None and await _exists_for(dsn):
        return
    conn = await asyncpg.connect(admin_dsn)
    try:
        exists = await conn.fetchval("SELECT 1 FROM pg_database WHERE datname = $1", database)
        if not exists:
            # a duplicate means another replica created it between our check and our CREATE: fine
            with contextlib.suppress(asyncpg.DuplicateDatabaseError, asyncpg.UniqueViolationError):
                await conn.execute(f'CREATE DATABASE "{database}"')
    finally:
        await conn.close()


async def _exists_for(dsn: str) -> bool:
    """Whether the database of `dsn` exists, found by connecting to it (False: not there yet)."""
    try:
        conn = await asyncpg.connect(dsn)
    except asyncpg.InvalidCatalogNameError:
        return False
    await conn.close()
    return True


async def provision_database(admin_dsn: str, database: str, role: str, password: str) -> None:
    """One login role that owns one database and everything in it, and may connect to no other (PUBLIC loses
    CONNECT on it and on `postgres`). Idempotent: run at every start, it also resets the password and takes over
    a database (and its tables, sequences, views and functions) made before roles existed."""
    for name in (database, role):
        if not _DB_NAME.match(name):
            raise ValueError(f"unsafe name {name!r}")
    conn = await asyncpg.connect(admin_dsn)
    try:
        if not await conn.fetchval("SELECT 1 FROM pg_roles WHERE rolname = $1", role):
            with contextlib.suppress(asyncpg.DuplicateObjectError):
                await conn.execute(f'CREATE ROLE "{role}" LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE')
        await conn.execute(await conn.fetchval("SELECT format('ALTER ROLE %I PASSWORD %L', $1::text, $2::text)",
                                               role, password))
        if await conn.fetchval("SELECT 1 FROM pg_database WHERE datname = $1", database):
            await conn.execute(f'ALTER DATABASE "{database}" OWNER TO "{role}"')
        else:
            with contextlib.suppress(asyncpg.DuplicateDatabaseError, asyncpg.UniqueViolationError):
                await conn.execute(f'CREATE DATABASE "{database}" OWNER "{role}"')
        await conn.execute(f'REVOKE ALL ON DATABASE "{database}" FROM PUBLIC')
        await conn.execute('REVOKE CONNECT ON DATABASE "postgres" FROM PUBLIC')
    finally:
        await conn.close()
    conn = await asyncpg.connect(with_database(admin_dsn, database))
    try:  # objects an earlier start made as the superuser
        statements = await conn.fetch(_TAKE_OVER, role)
        for row in statements:
            await conn.execute(row[0])
    finally:
        await conn.close()


_TAKE_OVER = """
SELECT format('ALTER %s %I.%I OWNER TO %I', CASE c.relkind WHEN 'S' THEN 'SEQUENCE' WHEN 'v' THEN 'VIEW'
              WHEN 'm' THEN 'MATERIALIZED VIEW' ELSE 'TABLE' END, n.nspname, c.relname, $1::text)
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p', 'v', 'm', 'S') AND pg_get_userbyid(c.relowner) <> $1::text
  AND NOT (c.relkind = 'S' AND EXISTS (SELECT 1 FROM pg_depend d WHERE d.objid = c.oid AND d.deptype IN ('a', 'i')))
UNION ALL
SELECT format('ALTER ROUTINE %s OWNER TO %I', p.oid::regprocedure, $1::text)
FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
WHERE n.nspname = 'public' AND pg_get_userbyid(p.proowner) <> $1::text
"""


async def create_pool(dsn: str, *, min_size: int = 1, max_size: int = 10,
                      reset_session: bool = True) -> asyncpg.Pool:
    """A connection pool; when traces are exported, every query made inside a recorded span (a traced request,
    message or job step) becomes a CLIENT span of that operation (OpenTelemetry database semantic conventions).
    A query outside one (a background loop's) draws no span: a lone `BEGIN` or `SELECT` trace tells nobody
    anything.

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
    parent); the span is drawn over the time it took. Nothing outside a recorded span."""
    if not in_recorded_span():
        return
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


# PostgreSQL rolled the transaction back to resolve a deadlock or a serialization conflict: transient, a caller may
# run it again (libs/runtime/loops.py does for periodic steps)
CONFLICT_ERRORS: tuple[type[BaseException], ...] = (asyncpg.exceptions.TransactionRollbackError,)
