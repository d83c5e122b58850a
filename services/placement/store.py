"""Every SQL statement of the placement service."""

from __future__ import annotations

from datetime import datetime

import asyncpg

from libs.contracts.events import AllocatedGpu, JobSubmitted, NodeRegistered, PriorityClassSet, QuotaSet


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
        """INSERT INTO pending_jobs (job_id, team, project, gpus, gpu_models, priority, submitted_at, traceparent,
                                    priority_class, kind)
           VALUES ($1,$2,$3,$4,$5,$6,$7,$8,$9,$10) ON CONFLICT (job_id) DO NOTHING""",
        data.job_id, data.team, data.project, data.gpus, data.gpu_models, data.priority, data.submitted_at,
        traceparent, data.priority_class, data.kind)
    return True


async def load_state(conn: asyncpg.Connection) -> dict[str, list[asyncpg.Record]]:
    """Everything one scheduling cycle reads, in one repeatable-read snapshot."""
    async with conn.transaction(isolation="repeatable_read", readonly=True):
        return {
            "nodes": await conn.fetch("SELECT cluster, node, schedulable FROM nodes ORDER BY cluster, node"),
            "gpus": await conn.fetch("SELECT uuid, cluster, node, idx, model, memory_mib, health FROM gpus"),
            "running": await conn.fetch(
                """SELECT a.allocation_id, a.job_id, a.team, a.project, a.node, a.granted_at, a.priority,
                          a.priority_class, a.kind, a.preempt_deadline, array_agg(g.gpu_uuid ORDER BY g.gpu_index)
                          AS gpu_uuids, min(g.model) AS gpu_model
                   FROM allocations a JOIN allocation_gpus g USING (allocation_id)
                   WHERE a.released_at IS NULL GROUP BY a.allocation_id"""),
            "pending": await conn.fetch(
                """SELECT job_id, team, project, gpus, gpu_models, priority, priority_class, kind, submitted_at,
                          traceparent FROM pending_jobs"""),
            "teams": await conn.fetch("SELECT team, org FROM policy_teams"),
            "quotas": await conn.fetch(
                """SELECT path, gpu_model, guaranteed, borrowing_limit, lending_limit, weight FROM policy_quotas
                   WHERE NOT deleted"""),
            "classes": await conn.fetch("SELECT name, value, preemptible, min_runtime_s FROM policy_priority_classes"),
        }


async def upsert_team(conn: asyncpg.Connection, team: str, org: str, revision: int) -> None:
    await conn.execute(
        """INSERT INTO policy_teams (team, org, revision) VALUES ($1,$2,$3)
           ON CONFLICT (team) DO UPDATE SET org = EXCLUDED.org, revision = EXCLUDED.revision
           WHERE policy_teams.revision < EXCLUDED.revision""", team, org, revision)


async def upsert_quota(conn: asyncpg.Connection, q: QuotaSet) -> None:
    await conn.execute(
        """INSERT INTO policy_quotas (path, gpu_model, guaranteed, borrowing_limit, lending_limit, weight, deleted,
                                      revision)
           VALUES ($1,$2,$3,$4,$5,$6,$7,$8)
           ON CONFLICT (path, gpu_model) DO UPDATE SET guaranteed = EXCLUDED.guaranteed,
               borrowing_limit = EXCLUDED.borrowing_limit, lending_limit = EXCLUDED.lending_limit,
               weight = EXCLUDED.weight, deleted = EXCLUDED.deleted, revision = EXCLUDED.revision
           WHERE policy_quotas.revision < EXCLUDED.revision""",
        q.path, q.gpu_model, q.guaranteed, q.borrowing_limit, q.lending_limit, q.weight, q.deleted, q.revision)


async def upsert_priority_class(conn: asyncpg.Connection, c: PriorityClassSet) -> None:
    await conn.execute(
        """INSERT INTO policy_priority_classes (name, value, preemptible, min_runtime_s, revision)
           VALUES ($1,$2,$3,$4,$5)
           ON CONFLICT (name) DO UPDATE SET value = EXCLUDED.value, preemptible = EXCLUDED.preemptible,
               min_runtime_s = EXCLUDED.min_runtime_s, revision = EXCLUDED.revision
           WHERE policy_priority_classes.revision < EXCLUDED.revision""",
        c.name, c.value, c.preemptible, c.min_runtime_s, c.revision)


async def take_pending(conn: asyncpg.Connection, job_id: str) -> asyncpg.Record | None:
    """Lock and remove the pending row; None if another cycle or a cancellation got there first."""
    return await conn.fetchrow(
        """DELETE FROM pending_jobs WHERE job_id = $1
           RETURNING job_id, team, project, priority, priority_class, kind""", job_id)


async def insert_allocation(conn: asyncpg.Connection, allocation_id: str, job: asyncpg.Record, cluster: str,
                            node: str, gpus: list[AllocatedGpu], granted_at: datetime) -> None:
    try:
        await conn.execute(
            """INSERT INTO allocations (allocation_id, job_id, team, project, cluster, node, granted_at, priority,
                                       priority_class, kind)
               VALUES ($1,$2,$3,$4,$5,$6,$7,$8,$9,$10)""",
            allocation_id, job["job_id"], job["team"], job["project"], cluster, node, granted_at, job["priority"],
            job["priority_class"], job["kind"])
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


async def start_preemption(conn: asyncpg.Connection, job_id: str, *, deadline: datetime, reason: str,
                           preemptor: str) -> tuple[asyncpg.Record, list[asyncpg.Record]] | None:
    """Mark the job's live allocation as being preempted; None if it has none or one is already under way."""
    alloc = await conn.fetchrow(
        """UPDATE allocations SET preempt_deadline = $2, preempt_reason = $3, preempted_by = $4
           WHERE job_id = $1 AND released_at IS NULL AND preempt_deadline IS NULL
           RETURNING allocation_id, job_id, team, project, cluster, node""", job_id, deadline, reason, preemptor)
    if alloc is None:
        return None
    gpus = await conn.fetch("SELECT gpu_uuid, gpu_index, model FROM allocation_gpus WHERE allocation_id = $1 "
                            "ORDER BY gpu_index", alloc["allocation_id"])
    return alloc, list(gpus)


async def due_preemptions(conn: asyncpg.Connection, now: datetime) -> list[asyncpg.Record]:
    return await conn.fetch(
        """SELECT job_id, preempt_reason FROM allocations
           WHERE released_at IS NULL AND preempt_deadline IS NOT NULL AND preempt_deadline <= $1""", now)


async def explain(conn: asyncpg.Connection, job_id: str) -> dict | None:
    """What placement knows about a job: pending (reason, position) or holding GPUs (and any preemption)."""
    pending = await conn.fetchrow(
        """SELECT job_id, team, gpus, gpu_models, priority, priority_class, submitted_at, reason, message,
                  (SELECT count(*) FROM pending_jobs p2 WHERE p2.priority > p.priority
                      OR (p2.priority = p.priority AND (p2.submitted_at, p2.job_id) < (p.submitted_at, p.job_id)))
                      AS ahead
           FROM pending_jobs p WHERE job_id = $1""", job_id)
    if pending is not None:
        return {"state": "pending", "reason": pending["reason"] or "Queued",
                "message": pending["message"] or "waiting for the next scheduling cycle",
                "position": int(pending["ahead"]) + 1, "priority": pending["priority"],
                "priority_class": pending["priority_class"],
                "preempting_for_it": [r["job_id"] for r in await conn.fetch(
                    "SELECT job_id FROM allocations WHERE released_at IS NULL AND preempted_by = $1", job_id)]}
    alloc = await conn.fetchrow(
        """SELECT allocation_id, node, granted_at, released_at, release_reason, preempt_deadline, preempt_reason,
                  preempted_by FROM allocations WHERE job_id = $1 ORDER BY granted_at DESC LIMIT 1""", job_id)
    if alloc is None:
        return None
    if alloc["released_at"] is None:
        doc = {"state": "allocated", "reason": "Running", "message": f"holding GPUs on {alloc['node']}",
               "allocation_id": alloc["allocation_id"]}
        if alloc["preempt_deadline"] is not None:
            doc.update(reason=alloc["preempt_reason"], preemptor_job_id=alloc["preempted_by"],
                       message=f"being preempted for job {alloc['preempted_by']}; GPUs taken back at "
                               f"{alloc['preempt_deadline'].isoformat()}",
                       deadline=alloc["preempt_deadline"].isoformat())
        return doc
    return {"state": "released", "reason": alloc["release_reason"],
            "message": f"released at {alloc['released_at'].isoformat()}", "allocation_id": alloc["allocation_id"]}
