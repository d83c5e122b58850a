"""Every SQL statement of the accounting service."""

from __future__ import annotations

import asyncpg

from libs.contracts.events import AllocationGranted, AllocationReleased


async def open_allocation(conn: asyncpg.Connection, data: AllocationGranted, model: str) -> None:
    await conn.execute(
        """INSERT INTO open_allocations (allocation_id, job_id, team, project, gpu_model, gpu_count, granted_at)
           VALUES ($1,$2,$3,$4,$5,$6,$7) ON CONFLICT DO NOTHING""",
        data.allocation_id, data.job_id, data.team, data.project, model, len(data.gpus), data.granted_at)


async def record_usage(conn: asyncpg.Connection, data: AllocationReleased, model: str, seconds: float) -> bool:
    inserted = await conn.fetchval(
        """INSERT INTO usage_ledger (allocation_id, job_id, team, project, gpu_model, gpu_count, gpu_seconds,
                                     started_at, ended_at, release_reason)
           VALUES ($1,$2,$3,$4,$5,$6,$7,$8,$9,$10) ON CONFLICT (allocation_id) DO NOTHING RETURNING 1""",
        data.allocation_id, data.job_id, data.team, data.project, model, len(data.gpus), seconds,
        data.granted_at, data.released_at, data.reason)
    await conn.execute("DELETE FROM open_allocations WHERE allocation_id = $1", data.allocation_id)
    return inserted is not None


async def list_usage(conn: asyncpg.Connection, *, team: str | None, job_id: str | None, limit: int,
                     after: str | None) -> list[asyncpg.Record]:
    return await conn.fetch(
        """SELECT allocation_id, job_id, team, project, gpu_model, gpu_count, gpu_seconds, started_at, ended_at,
                  release_reason
           FROM usage_ledger
           WHERE ($1::text IS NULL OR team = $1) AND ($2::text IS NULL OR job_id = $2)
             AND ($3::text IS NULL OR allocation_id > $3)
           ORDER BY allocation_id LIMIT $4""", team, job_id, after, limit)
