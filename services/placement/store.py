"""Every SQL statement of the placement service."""

from __future__ import annotations

from datetime import datetime

import asyncpg

from libs.contracts.events import AllocatedGpu, JobSubmitted, NodeRegistered


class AllocationConflict(Exception):
    """The database refused an allocation (a GPU already held, or the job already placed): the plan was stale."""


async def upsert_node(conn: asyncpg.Connection, data: NodeRegistered) -> None:
    await conn.execute(
        """INSERT INTO nodes (cluster, node) VALUES ($1, $2)
           ON CONFLICT (cluster, node) DO UPDATE SET updated_at = now()""", data.cluster, data.node)
    for g in data.gpus:
        await conn.execute(
            """INSERT INTO gpus (uuid, cluster, node, idx, model, memory_mib, health)
               VALUES ($1,$2,$3,$4,$5,$6,$7)
               ON CONFLICT (uuid) DO UPDATE SET cluster = EXCLUDED.cluster, node = EXCLUDED.node,
                   idx = EXCLUDED.idx, model = EXCLUDED.model, memory_mib = EXCLUDED.memory_mib,
                   health = EXCLUDED.health""",
            g.uuid, data.cluster, data.node, g.index, g.model, g.memory_mib, g.health)


async def set_node_schedulable(conn: asyncpg.Connection, cluster: str, node: str, schedulable: bool) -> None:
    """Upsert, so a node-lost event handled before the node's registration (a redelivery) is not forgotten when
    the registration arrives (upsert_node leaves `schedulable` alone)."""
    await conn.execute(
        """INSERT INTO nodes (cluster, node, schedulable) VALUES ($1, $2, $3)
           ON CONFLICT (cluster, node) DO UPDATE SET schedulable = EXCLUDED.schedulable, updated_at = now()""",
        cluster, node, schedulable)


async def set_gpu_health(conn: asyncpg.Connection, uuid: str, health: str) -> None:
    await conn.execute("UPDATE gpus SET health = $2 WHERE uuid = $1", uuid, health)


async def add_pending(conn: asyncpg.Connection, data: JobSubmitted, traceparent: str | None) -> bool:
    """False when the job already finished or is already placed: a late or repeated submission is ignored."""
    finished = await conn.fetchval("SELECT 1 FROM finished_jobs WHERE job_id = $1", data.job_id)
    live = await conn.fetchval(
        "SELECT 1 FROM allocations WHERE job_id = $1 AND released_at IS NULL", data.job_id)
    if finished or live:
        return False
    await conn.execute(
        """INSERT INTO pending_jobs (job_id, team, project, gpus, gpu_models, priority, submitted_at, traceparent)
           VALUES ($1,$2,$3,$4,$5,$6,$7,$8) ON CONFLICT (job_id) DO NOTHING""",
        data.job_id, data.team, data.project, data.gpus, data.gpu_models, data.priority, data.submitted_at,
        traceparent)
    return True


async def load_state(conn: asyncpg.Connection) -> tuple[list, list, list[str], list]:
    nodes = await conn.fetch("SELECT cluster, node, schedulable FROM nodes ORDER BY cluster, node")
    gpus = await conn.fetch("SELECT uuid, cluster, node, idx, model, memory_mib, health FROM gpus")
    held = [r["gpu_uuid"] for r in await conn.fetch("SELECT gpu_uuid FROM allocation_gpus WHERE live")]
    pending = await conn.fetch(
        "SELECT job_id, team, project, gpus, gpu_models, priority, submitted_at, traceparent FROM pending_jobs")
    return list(nodes), list(gpus), held, list(pending)


async def take_pending(conn: asyncpg.Connection, job_id: str) -> asyncpg.Record | None:
    """Lock and remove the pending row; None if another cycle or a cancellation got there first."""
    return await conn.fetchrow("DELETE FROM pending_jobs WHERE job_id = $1 RETURNING job_id, team, project",
                               job_id)


async def insert_allocation(conn: asyncpg.Connection, allocation_id: str, job: asyncpg.Record, cluster: str,
                            node: str, gpus: list[AllocatedGpu], granted_at: datetime) -> None:
    try:
        await conn.execute(
            """INSERT INTO allocations (allocation_id, job_id, team, project, cluster, node, granted_at)
               VALUES ($1,$2,$3,$4,$5,$6,$7)""",
            allocation_id, job["job_id"], job["team"], job["project"], cluster, node, granted_at)
        await conn.executemany(
            "INSERT INTO allocation_gpus (allocation_id, gpu_uuid, gpu_index, model) VALUES ($1,$2,$3,$4)",
            [(allocation_id, g.uuid, g.index, g.model) for g in gpus])
    except asyncpg.UniqueViolationError as exc:
        raise AllocationConflict(str(exc)) from exc


async def record_pending_reasons(conn: asyncpg.Connection, reasons: list[tuple[str, str, str]]) -> None:
    await conn.executemany("UPDATE pending_jobs SET reason = $2, message = $3 WHERE job_id = $1", reasons)


async def release_for_job(conn: asyncpg.Connection, job_id: str, reason: str,
                          at: datetime) -> tuple[asyncpg.Record, list[asyncpg.Record]] | None:
    alloc = await conn.fetchrow(
        """UPDATE allocations SET released_at = $2, release_reason = $3
           WHERE job_id = $1 AND released_at IS NULL
           RETURNING allocation_id, job_id, team, project, cluster, node, granted_at, released_at""",
        job_id, at, reason)
    if alloc is None:
        return None
    gpus = await conn.fetch(
        """UPDATE allocation_gpus SET live = false WHERE allocation_id = $1
           RETURNING gpu_uuid, gpu_index, model""", alloc["allocation_id"])
    return alloc, sorted(gpus, key=lambda g: g["gpu_index"])


async def mark_finished(conn: asyncpg.Connection, job_id: str) -> bool:
    """Forget a pending job that finished; True if it was still pending."""
    await conn.execute("INSERT INTO finished_jobs (job_id) VALUES ($1) ON CONFLICT DO NOTHING", job_id)
    return await conn.fetchval("DELETE FROM pending_jobs WHERE job_id = $1 RETURNING 1", job_id) is not None


async def list_allocations(conn: asyncpg.Connection, *, job_id: str | None, active: bool | None, limit: int,
                           after: str | None) -> list[asyncpg.Record]:
    return await conn.fetch(
        """SELECT a.allocation_id, a.job_id, a.team, a.project, a.cluster, a.node, a.granted_at, a.released_at,
                  a.release_reason,
                  coalesce(json_agg(json_build_object('uuid', g.gpu_uuid, 'index', g.gpu_index, 'model', g.model)
                           ORDER BY g.gpu_index) FILTER (WHERE g.gpu_uuid IS NOT NULL), '[]') AS gpus
           FROM allocations a LEFT JOIN allocation_gpus g USING (allocation_id)
           WHERE ($1::text IS NULL OR a.job_id = $1)
             AND ($2::boolean IS NULL OR (a.released_at IS NULL) = $2)
             AND ($3::text IS NULL OR a.allocation_id > $3)
           GROUP BY a.allocation_id ORDER BY a.allocation_id LIMIT $4""",
        job_id, active, after, limit)


async def pending_reason(conn: asyncpg.Connection, job_id: str) -> asyncpg.Record | None:
    return await conn.fetchrow("SELECT reason, message FROM pending_jobs WHERE job_id = $1", job_id)
