"""Fixtures shared by the integration tests (the servers themselves come from tests/conftest.py)."""

from __future__ import annotations

import logging
import uuid
from collections.abc import AsyncIterator, Iterator

import asyncpg
import pytest
from nats.js import JetStreamContext

from libs.bus.connection import NatsClient, connect, ensure_streams
from libs.runtime import service as runtime_module
from libs.store.database import create_pool, database_name, ensure_database, with_database
from libs.store.migrations import migrate, package_migrations, store_migrations


@pytest.fixture
def keep_test_logging_and_tracing(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A ServiceRuntime owns its process's logging and tracing; in a shared test process, put them back after."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    monkeypatch.setattr(runtime_module, "shutdown_tracing", lambda: None)
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


@pytest.fixture
async def fresh_database_dsn(pg_admin_dsn: str) -> AsyncIterator[str]:
    """DSN of a database that does not exist yet (a service must create it), dropped afterwards."""
    name = f"fresh_{uuid.uuid4().hex[:12]}"
    yield with_database(pg_admin_dsn, name)
    admin = await asyncpg.connect(pg_admin_dsn)
    try:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await admin.close()


@pytest.fixture
async def js(nats_url: str, clean_jetstream: None) -> AsyncIterator[JetStreamContext]:
    """A test's own JetStream view on empty streams (the services under test declare the streams)."""
    nc = await connect(nats_url, "integration-test-observer")
    try:
        yield nc.jetstream()
    finally:
        await nc.close()


@pytest.fixture
async def bus(nats_url: str, clean_jetstream: None) -> AsyncIterator[tuple[NatsClient, JetStreamContext]]:
    """A connection and its JetStream view on freshly declared, empty streams."""
    nc = await connect(nats_url, "integration-test-bus")
    js = nc.jetstream()
    await ensure_streams(js)
    try:
        yield nc, js
    finally:
        await nc.close()


@pytest.fixture
async def placement_db(fresh_database_dsn: str, pg_admin_dsn: str) -> AsyncIterator[asyncpg.Pool]:
    """A pool on a fresh, migrated placement database (tests of placement's store seed it themselves)."""
    await ensure_database(pg_admin_dsn, database_name(fresh_database_dsn))
    pool = await create_pool(fresh_database_dsn, max_size=12)
    await migrate(pool, store_migrations() + package_migrations("placement", "services.placement"))
    try:
        yield pool
    finally:
        await pool.close()
