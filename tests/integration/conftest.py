"""Fixtures shared by the integration tests (the servers themselves come from tests/conftest.py)."""

from __future__ import annotations

import logging
import uuid
from collections.abc import AsyncIterator, Iterator

import asyncpg
import pytest
from nats.js import JetStreamContext

from libs.bus.connection import connect
from libs.runtime import service as runtime_module
from libs.store.database import with_database


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
