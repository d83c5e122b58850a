"""Connection pools and per-service databases (one PostgreSQL database per service, never shared)."""

from __future__ import annotations

import contextlib
import re
from urllib.parse import urlsplit, urlunsplit

import asyncpg

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


async def create_pool(dsn: str, *, min_size: int = 1, max_size: int = 10) -> asyncpg.Pool:
    pool = await asyncpg.create_pool(dsn, min_size=min_size, max_size=max_size, command_timeout=30)
    assert pool is not None
    return pool
