"""A local install's PostgreSQL, attacked as another account on the host would (issue #16): before, the embedded
server trusted every local user as superuser (anyone could insert an admin token with no audit entry), ran with
fsync off, and `gpupool status` printed the NATS admin password. Each case failed on that code."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import asyncpg
import pytest

from libs.devstack.servers import SCRAM_HBA, start_postgres
from libs.devstack.stack import SERVICE_DATABASES, postgres_passwords, provision_service_roles, redact
from libs.store.database import ensure_database, with_database


def _without_password(url: str) -> str:
    scheme, _, rest = url.partition("://")
    login, _, where = rest.rpartition("@")
    return f"{scheme}://{login.split(':')[0]}@{where}"


@pytest.fixture
def install(tmp_path: Path):  # type: ignore[no-untyped-def]
    """What `gpupool up` does with its embedded server: generated secrets, SCRAM, a role per service."""
    passwords = postgres_passwords(tmp_path)
    server = start_postgres(tmp_path / "postgres", password=passwords["postgres"])
    try:
        dsns = provision_service_roles(server.url, "gpupool", passwords)
        yield server, dsns, passwords
    finally:
        server.stop()


async def test_nobody_connects_without_the_password(install) -> None:  # type: ignore[no-untyped-def]
    server, dsns, _ = install
    for url in (server.url, dsns["queue"]):
        with pytest.raises(asyncpg.InvalidPasswordError):
            await asyncpg.connect(_without_password(url), password="")
        with pytest.raises(asyncpg.InvalidPasswordError):
            await asyncpg.connect(_without_password(url), password="guess-guess-guess")
    conn = await asyncpg.connect(server.url)
    try:
        methods = {r["auth_method"] for r in await conn.fetch("SELECT auth_method FROM pg_hba_file_rules")}
        assert methods == {"scram-sha-256"}, "the Unix socket too needs the password"
        assert await conn.fetchval("SHOW listen_addresses") == "127.0.0.1"
        assert await conn.fetchval("SHOW password_encryption") == "scram-sha-256"
    finally:
        await conn.close()


async def test_each_service_owns_only_its_own_database(install) -> None:  # type: ignore[no-untyped-def]
    server, dsns, passwords = install
    queue = await asyncpg.connect(dsns["queue"])
    try:
        assert await queue.fetchval("SELECT current_user") == "gpupool_queue"
        assert not await queue.fetchval("SELECT rolsuper OR rolcreatedb OR rolcreaterole FROM pg_roles "
                                        "WHERE rolname = current_user")
        await queue.execute("CREATE TABLE jobs (id int)")  # it owns its database's schema
    finally:
        await queue.close()
    # the gateway's role (where API tokens live) cannot reach the queue's database, nor the queue's reach it
    for intruder, target in (("gateway", "queue"), ("queue", "gateway"), ("inventory", "postgres")):
        stranger = dsns[intruder].rsplit("/", 1)[0] + f"/{'gpupool_' + target if target != 'postgres' else target}"
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await asyncpg.connect(stranger)
    # a service finds its existing database without touching `postgres`
    await ensure_database(with_database(dsns["queue"], "postgres"), "gpupool_queue", dsns["queue"])
    assert set(passwords) == {"postgres", *SERVICE_DATABASES}


def test_the_secrets_are_kept_private_and_reused(install, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    _, _, passwords = install
    path = tmp_path / "secrets" / "postgres.json"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert postgres_passwords(tmp_path) == passwords == json.loads(path.read_text())
    assert len(set(passwords.values())) == len(passwords), "one secret per role"


async def test_commits_are_durable_by_default_and_unsafe_only_when_asked(tmp_path: Path) -> None:
    """Before: fsync=off and full_page_writes=off on every embedded server."""
    for durable, expected in ((True, "on"), (False, "off")):
        server = start_postgres(tmp_path / f"pg-{durable}", durable=durable)
        try:
            conn = await asyncpg.connect(server.url)
            try:
                assert await conn.fetchval("SHOW fsync") == expected
                assert await conn.fetchval("SHOW full_page_writes") == expected
                assert await conn.fetchval("SHOW synchronous_commit") == "on"  # either way
            finally:
                await conn.close()
        finally:
            server.stop()


async def test_a_data_directory_from_before_passwords_is_switched_over(tmp_path: Path) -> None:
    """An install made with trust keeps its data and stops trusting anyone."""
    data = tmp_path / "postgres"
    server = start_postgres(data)  # trust, as before
    conn = await asyncpg.connect(server.url)
    await conn.execute("CREATE TABLE kept (v text); INSERT INTO kept VALUES ('still here')")
    await conn.close()
    server.stop()
    passwords = postgres_passwords(tmp_path)
    server = start_postgres(data, password=passwords["postgres"])
    try:
        assert (data / "pg_hba.conf").read_text() == SCRAM_HBA, "switched over to SCRAM"

        async def refused() -> bool:
            try:
                await (await asyncpg.connect(_without_password(server.url), password="")).close()
            except asyncpg.InvalidPasswordError:
                return True
            return False

        assert await refused()
        conn = await asyncpg.connect(server.url)
        assert await conn.fetchval("SELECT v FROM kept") == "still here"
        await conn.close()
    finally:
        server.stop()


def test_secrets_are_redacted_from_what_is_printed() -> None:
    text = json.dumps({"nats_url": "nats://admin:s3cr3t-Pa55@127.0.0.1:4222,nats://admin:other@127.0.0.1:4223",
                       "db": "postgresql://gpupool_queue:abc_DEF-123@127.0.0.1:5432/gpupool_queue",
                       "plain": "http://127.0.0.1:8080/v1/jobs"})
    shown = redact(text)
    assert "s3cr3t" not in shown and "other@" not in shown and "abc_DEF" not in shown
    assert "nats://admin:***@127.0.0.1:4222" in shown and "postgresql://gpupool_queue:***@127.0.0.1" in shown
    assert "http://127.0.0.1:8080/v1/jobs" in shown
