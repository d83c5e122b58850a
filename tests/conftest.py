"""Real NATS JetStream and PostgreSQL for the tests, started once per session and only when a test asks.

Where the servers come from, first match wins, separately for each server:
  1. a URL in the environment: GPUPOOL_TEST_NATS_URL / GPUPOOL_TEST_DATABASE_URL (or GPUPOOL_NATS_URL /
     GPUPOOL_DATABASE_URL), e.g. servers a CI job already runs;
  2. testcontainers, when a Docker engine answers;
  3. embedded servers (libs.devstack.servers) on free loopback ports, data in pytest's tmp dir.
Server fixtures are synchronous so they do not depend on any event loop's scope.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from functools import cache
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import nats
import pytest

from libs.devstack.servers import start_nats, start_postgres


def _env_url(*names: str) -> str | None:
    for name in names:
        if value := os.environ.get(name, "").strip():
            return value
    return None


@cache
def _docker_available() -> bool:
    """True if a Docker engine answers within a couple of seconds; never raises."""
    if not os.environ.get("DOCKER_HOST") and not os.path.exists("/var/run/docker.sock"):
        return False  # the common case on CI boxes and laptops without Docker: skip the slow import
    try:
        import docker

        client = docker.from_env(timeout=3)
        try:
            return bool(client.ping())
        finally:
            client.close()
    except Exception:
        return False


@pytest.fixture(scope="session")
def nats_url() -> Iterator[str]:
    if url := _env_url("GPUPOOL_TEST_NATS_URL", "GPUPOOL_NATS_URL"):
        yield url
    elif _docker_available():
        try:
            from testcontainers.community.nats import NatsContainer
        except ImportError:  # older testcontainers
            from testcontainers.nats import NatsContainer
        with NatsContainer("nats:2.10", jetstream=True) as container:
            yield container.nats_uri()
    else:
        data = _private_dir("nats")
        server = start_nats(data)
        try:
            yield server.url
        finally:
            server.stop()
            shutil.rmtree(data, ignore_errors=True)


@pytest.fixture(scope="session")
def pg_admin_dsn() -> Iterator[str]:
    """DSN of a superuser connection to a maintenance database; tests use `pg_database` instead."""
    if url := _env_url("GPUPOOL_TEST_DATABASE_URL", "GPUPOOL_DATABASE_URL"):
        yield url
    elif _docker_available():
        try:
            from testcontainers.community.postgres import PostgresContainer
        except ImportError:
            from testcontainers.postgres import PostgresContainer
        with PostgresContainer("postgres:16-alpine", driver=None) as container:
            yield container.get_connection_url()
    else:
        data = _private_dir("postgres")
        server = start_postgres(data, durable=False)  # tests: fsync off (see libs/devstack/servers.py)
        try:
            yield server.url
        finally:
            server.stop()
            shutil.rmtree(data, ignore_errors=True)


def _private_dir(name: str) -> Path:
    """A data directory no other pytest session will clean up under us (pytest prunes old basetemp folders,
    which would delete a server's files while a concurrent session still runs on them)."""
    return Path(tempfile.mkdtemp(prefix=f"gpupool-test-{name}-"))


def _with_database(dsn: str, database: str) -> str:
    parts = urlsplit(dsn)
    return urlunsplit((parts.scheme, parts.netloc, "/" + database, parts.query, parts.fragment))


@pytest.fixture
async def pg_database(pg_admin_dsn: str) -> AsyncIterator[str]:
    """DSN of a fresh, empty database just for this test; dropped afterwards."""
    name = f"test_{uuid.uuid4().hex[:16]}"
    admin = await asyncpg.connect(pg_admin_dsn)
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
    finally:
        await admin.close()
    try:
        yield _with_database(pg_admin_dsn, name)
    finally:
        admin = await asyncpg.connect(pg_admin_dsn)
        try:
            await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        finally:
            await admin.close()


@pytest.fixture
async def clean_jetstream(nats_url: str) -> None:
    """Delete every stream (KV buckets and object stores included) so the test starts from empty."""
    nc = await nats.connect(nats_url, connect_timeout=5, max_reconnect_attempts=0)
    try:
        js = nc.jetstream()
        for info in await js.streams_info():
            await js.delete_stream(info.config.name)
    finally:
        await nc.close()
