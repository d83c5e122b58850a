"""Every SQL statement of the gateway: API tokens and the audit log."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any

import asyncpg


async def insert_token(conn: asyncpg.Connection, *, token_id: str, name: str, role: str, team: str | None,
                       secret_hash: str, created_by: str, expires_at: datetime | None) -> asyncpg.Record:
    return await conn.fetchrow(
        """INSERT INTO api_tokens (token_id, name, role, team, secret_hash, created_by, expires_at)
           VALUES ($1,$2,$3,$4,$5,$6,$7)
           RETURNING token_id, name, role, team, created_by, created_at, expires_at, revoked_at, last_used_at""",
        token_id, name, role, team, secret_hash, created_by, expires_at)


async def find_token(conn: asyncpg.Connection, token_id: str) -> asyncpg.Record | None:
    return await conn.fetchrow(
        "SELECT token_id, name, role, team, secret_hash, expires_at, revoked_at FROM api_tokens WHERE token_id = $1",
        token_id)


async def touch_token(conn: asyncpg.Connection, token_id: str) -> None:
    """At most one write a minute per token: last-used is for people, not a hot path."""
    await conn.execute(
        """UPDATE api_tokens SET last_used_at = now()
           WHERE token_id = $1 AND (last_used_at IS NULL OR last_used_at < now() - interval '1 minute')""",
        token_id)


async def list_tokens(conn: asyncpg.Connection, *, team: str | None, limit: int,
                      after: str | None) -> list[asyncpg.Record]:
    return await conn.fetch(
        """SELECT token_id, name, role, team, created_by, created_at, expires_at, revoked_at, last_used_at
           FROM api_tokens WHERE ($1::text IS NULL OR team = $1) AND ($2::text IS NULL OR token_id > $2)
           ORDER BY token_id LIMIT $3""", team, after, limit)


async def revoke_token(conn: asyncpg.Connection, token_id: str) -> asyncpg.Record | None:
    return await conn.fetchrow(
        """UPDATE api_tokens SET revoked_at = coalesce(revoked_at, now()) WHERE token_id = $1
           RETURNING token_id, name, role, team, created_by, created_at, expires_at, revoked_at, last_used_at""",
        token_id)


async def audit(conn: asyncpg.Connection, *, actor: str, actor_role: str, action: str, target: str | None,
                before: Any, after: Any, trace_id: str | None) -> None:
    await conn.execute(
        """INSERT INTO audit_log (actor, actor_role, action, target, before, after, trace_id)
           VALUES ($1,$2,$3,$4,$5::jsonb,$6::jsonb,$7)""",
        actor, actor_role, action, target, None if before is None else json.dumps(before, default=str),
        None if after is None else json.dumps(after, default=str), trace_id)


async def list_audit(conn: asyncpg.Connection, *, action: str | None, limit: int,
                     before_id: int | None) -> list[asyncpg.Record]:
    return await conn.fetch(
        """SELECT id, at, actor, actor_role, action, target, before::text, after::text, trace_id FROM audit_log
           WHERE ($1::text IS NULL OR action = $1) AND ($2::bigint IS NULL OR id < $2)
           ORDER BY id DESC LIMIT $3""", action, before_id, limit)


TOKEN_CHANNEL = "gpupool_gateway_tokens"  # see migrations/0002_token_changes.sql


async def listen_token_changes(conn: asyncpg.Connection, on_change: Callable[[str], None],
                               on_lost: Callable[[], None]) -> Callable[[], Awaitable[None]]:
    """Call `on_change(token_id)` for every change that can withdraw a token, `on_lost()` if the connection dies
    (from then on nothing is announced to this gateway). Returns what stops listening, before the connection goes
    back to the pool."""
    def lost(_conn: Any) -> None:
        on_lost()

    def changed(_conn: Any, _pid: int, _channel: str, token_id: str) -> None:
        on_change(token_id)

    async def stop() -> None:
        conn.remove_termination_listener(lost)
        await conn.remove_listener(TOKEN_CHANNEL, changed)

    conn.add_termination_listener(lost)
    await conn.add_listener(TOKEN_CHANNEL, changed)
    return stop
