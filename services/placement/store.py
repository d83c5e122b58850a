"""Every SQL statement of the placement service."""

from __future__ import annotations

from datetime import datetime

import asyncpg

from libs.contracts.events import AllocatedGpu, JobSubmitted, NodeRegistered, PriorityClassSet, QuotaSet

_ALLOCATION = "allocation_id, job_id, replica, team, project, cluster, node, granted_at, released_at"
# what an allocation holds of one GPU, as AllocatedGpu's fields
_HELD = ("gpu_uuid AS uuid, gpu_index AS index, model, share_milli, memory_mib, mig_profile, mig_start")


def held_gpu(row: asyncpg.Record) -> AllocatedGpu:
    return AllocatedGpu(**dict(row))


class AllocationConflict(Exception):
    """The database refused an allocation (a GPU already held, or the replica already placed): the plan was
    stale. The unit of work rolls back; nothing half-applied remains."""


# --- the pool ---------------------------------------------------------------------------------------------------
async def upsert_node(conn: asyncpg.Connection, data: NodeRegistered) -> None:
    await conn.execute(
        """INSERT INTO nodes (cluster, node) VALUES ($1, $2)
           ON CONFLICT (cluster, node) DO UPDATE SET updated_at = now()""", data.cluster, data.node)
    for g in data.gpus:
        await conn.execute(
            """INSERT INTO gpus (uuid, cluster, node, idx, model, memory_mib, health, sharing)
               VALUES ($1,$2,$3,$4,$5,$6,$7,$8)
               ON CONFLICT (uuid) DO UPDATE SET cluster = EXCLUDED.cluster, node = EXCLUDED.node,
                   idx = EXCLUDED.idx, model = EXCLUDED.model, memory_mib = EXCLUDED.memory_mib,
                   health = EXCLUDED.health,
                   sharing = CASE WHEN gpus.sharing_set_by_operator THEN gpus.sharing ELSE EXCLUDED.sharing END""",
            g.uuid, data.cluster, data.node, g.index, g.model, g.memory_mib, g.health,
            "mig" if g.mig_mode else "exclusive")


async def set_node_schedulable(conn: asyncpg.Connection, cluster: str, node: str, schedulable: bool) -> None:
    """Upsert, so a node-lost event handled before the node's registration (a redelivery) is not forgotten when
    the registration arrives (upsert_node leaves `schedulable` alone)."""
    await conn.execute(
        """INSERT INTO nodes (cluster, node, schedulable) VALUES ($1, $2, $3)
           ON CONFLICT (cluster, node) DO UPDATE SET schedulable = EXCLUDED.schedulable, updated_at = now()""",
        cluster, node, schedulable)


async def set_gpu_sharing(conn: asyncpg.Connection, uuid: str, mode: str) -> bool:
    """An operator's choice; it outlives re-registrations. False when the GPU is not known (yet)."""
    return await conn.fetchval(
        "UPDATE gpus SET sharing = $2, sharing_set_by_operator = true WHERE uuid = $1 RETURNING true",
        uuid, mode) is not None


async def set_gpu_health(conn: asyncpg.Connection, uuid: str, health: str) -> None:
    await conn.execute("UPDATE gpus SET health = $2 WHERE uuid = $1", uuid, health)


# --- wanted jobs ------------------------------------------------------------------------------------------------
async def add_pending(conn: asyncpg.Connection, data: JobSubmitted, traceparent: str | None) -> bool:
    """Want the job (again, after a requeue). False when it already finished, or still holds GPUs (a late or
    repeated submission is ignored)."""
    if await conn.fetchval("SELECT 1 FROM finished_jobs WHERE job_id = $1", data.job_id):
        return False
    if await conn.fetchval("SELECT 1 FROM allocations WHERE job_id = $1 AND released_at IS NULL", data.job_id):
        return False
    await conn.execute(
        """INSERT INTO pending_jobs (job_id, team, project, gpus, gpu_models, priority, submitted_at, traceparent,
                                    priority_class, kind, gang_nodes, gpus_per_node, replicas, max_runtime_s,
                                    gpu_fraction_milli, gpu_memory_mib, mig_profile, exclusive)
           VALUES ($1,$2,$3,$4,$5,$6,$7,$8,$9,$10,$11,$12,$13,$14,$15,$16,$17,$18)
           ON CONFLICT (job_id) DO UPDATE SET satisfied = false, reason = NULL, message = NULL""",
        data.job_id, data.team, data.project, data.gpus, data.gpu_models, data.priority, data.submitted_at,
        traceparent, data.priority_class, data.kind, data.gang_nodes, data.gpus_per_node, data.replicas,
        data.max_runtime_s, data.gpu_fraction_milli, data.gpu_memory_mib, data.mig_profile, data.exclusive)
    return True


async def load_state(conn: asyncpg.Connection) -> dict[str, list[asyncpg.Record]]:
    """Everything one scheduling cycle reads, in one repeatable-read snapshot."""
    async with conn.transaction(isolation="repeatable_read", readonly=True):
        return {
            "nodes": await conn.fetch("SELECT cluster, node, schedulable FROM nodes ORDER BY cluster, node"),
            "gpus": await conn.fetch("SELECT uuid, cluster, node, idx, model, memory_mib, health, sharing FROM gpus"),
            "running": await conn.fetch(
                """SELECT a.allocation_id, a.job_id, a.replica, a.team, a.project, a.node, a.granted_at, a.priority,
                          a.priority_class, a.kind, a.preempt_deadline, a.preempted_by, a.max_runtime_s,
                          coalesce(p.replicas, 1) AS replicas,
                          array_agg(g.gpu_uuid ORDER BY g.gpu_index) AS gpu_uuids, min(g.model) AS gpu_model,
                          min(g.share_milli) AS share_milli, max(g.memory_mib) AS gpu_memory_mib,
                          array_agg(g.mig_profile ORDER BY g.gpu_index) AS mig_profiles,
                          array_agg(g.mig_start ORDER BY g.gpu_index) AS mig_starts
                   FROM allocations a JOIN allocation_gpus g USING (allocation_id)
                        LEFT JOIN pending_jobs p USING (job_id)
                   WHERE a.released_at IS NULL GROUP BY a.allocation_id, p.replicas"""),
            "pending": await conn.fetch(
                """SELECT job_id, team, project, gpus, gpu_models, priority, priority_class, kind, submitted_at,
                          traceparent, gang_nodes, gpus_per_node, replicas, max_runtime_s, gpu_fraction_milli,
                          gpu_memory_mib, mig_profile, exclusive
                   FROM pending_jobs WHERE NOT satisfied"""),
            "teams": await conn.fetch("SELECT team, org FROM policy_teams"),
            "quotas": await conn.fetch(
                """SELECT path, gpu_model, guaranteed, borrowing_limit, lending_limit, weight FROM policy_quotas
                   WHERE NOT deleted"""),
            "classes": await conn.fetch("SELECT name, value, preemptible, min_runtime_s FROM policy_priority_classes"),
            "policy_revision": await conn.fetchval(
                """SELECT greatest((SELECT max(revision) FROM policy_teams), (SELECT max(revision) FROM policy_quotas),
                                   (SELECT max(revision) FROM policy_priority_classes))"""),
        }


async def claim_job(conn: asyncpg.Connection, job_id: str) -> asyncpg.Record | None:
    """Lock the wanted job for placing; None if it is no longer wanted or already satisfied."""
    return await conn.fetchrow(
        """SELECT job_id, team, project, priority, priority_class, kind, replicas, max_runtime_s FROM pending_jobs
           WHERE job_id = $1 AND NOT satisfied FOR UPDATE""", job_id)


async def refresh_satisfied(conn: asyncpg.Connection, job_id: str, *, after_release: bool = False) -> bool:
    """satisfied = every wanted replica holds a live allocation; returns the new value. After a release only a
    replicated job wants its replica back by itself: a single job or a gang comes back only if the queue requeues
    it (it may instead end it, e.g. after an idle reclaim)."""
    return bool(await conn.fetchval(
        """UPDATE pending_jobs p SET satisfied = (SELECT count(*) FROM allocations a
                                                 WHERE a.job_id = p.job_id AND a.released_at IS NULL) >= p.replicas
           WHERE job_id = $1 AND (NOT $2 OR p.replicas > 1) RETURNING satisfied""", job_id, after_release))


async def set_replicas(conn: asyncpg.Connection, job_id: str, replicas: int) -> bool:
    return await conn.fetchval("UPDATE pending_jobs SET replicas = $2 WHERE job_id = $1 RETURNING 1",
                               job_id, replicas) is not None


async def insert_allocation(conn: asyncpg.Connection, allocation_id: str, job: asyncpg.Record, replica: int,
                            cluster: str, node: str, gpus: list[AllocatedGpu], granted_at: datetime,
                            mig_slots: dict[str, int]) -> None:
    try:
        await conn.execute(
            """INSERT INTO allocations (allocation_id, job_id, replica, team, project, cluster, node, granted_at,
                                       priority, priority_class, kind, max_runtime_s)
               VALUES ($1,$2,$3,$4,$5,$6,$7,$8,$9,$10,$11,$12)""",
            allocation_id, job["job_id"], replica, job["team"], job["project"], cluster, node, granted_at,
            job["priority"], job["priority_class"], job["kind"], job["max_runtime_s"])
        await conn.executemany(
            """INSERT INTO allocation_gpus (allocation_id, gpu_uuid, gpu_index, model, share_milli, memory_mib,
                                           mig_profile, mig_start, mig_slots)
               VALUES ($1,$2,$3,$4,$5,$6,$7,$8,$9)""",
            [(allocation_id, g.uuid, g.index, g.model, g.share_milli, g.memory_mib, g.mig_profile, g.mig_start,
              mig_slots.get(g.uuid)) for g in gpus])
    except asyncpg.UniqueViolationError as exc:
        raise AllocationConflict(str(exc)) from exc


async def record_pending_reasons(conn: asyncpg.Connection, reasons: list[tuple[str, str, str]]) -> None:
    await conn.executemany("UPDATE pending_jobs SET reason = $2, message = $3 WHERE job_id = $1", reasons)


async def release(conn: asyncpg.Connection, job_id: str, reason: str, at: datetime, *,
                  replica: int | None = None, min_replica: int | None = None,
                  allocation_id: str | None = None) -> list[tuple[asyncpg.Record, list[asyncpg.Record]]]:
    """Release the job's live allocations (all, one replica, replicas ≥ min_replica, or one allocation)."""
    allocs = await conn.fetch(
        f"""UPDATE allocations SET released_at = $2, release_reason = $3
            WHERE job_id = $1 AND released_at IS NULL AND ($4::int IS NULL OR replica = $4)
              AND ($5::int IS NULL OR replica >= $5) AND ($6::text IS NULL OR allocation_id = $6)
            RETURNING {_ALLOCATION}""", job_id, at, reason, replica, min_replica, allocation_id)
    out = []
    for alloc in sorted(allocs, key=lambda a: a["replica"]):
        gpus = await conn.fetch(
            f"UPDATE allocation_gpus SET live = false WHERE allocation_id = $1 RETURNING {_HELD}",
            alloc["allocation_id"])
        out.append((alloc, [held_gpu(g) for g in sorted(gpus, key=lambda g: g["index"])]))
    return out


async def mark_finished(conn: asyncpg.Connection, job_id: str) -> None:
    """The job is over: never want it again (even if a late submission event shows up)."""
    await conn.execute("INSERT INTO finished_jobs (job_id) VALUES ($1) ON CONFLICT DO NOTHING", job_id)
    await conn.execute("DELETE FROM pending_jobs WHERE job_id = $1", job_id)


async def is_wanted(conn: asyncpg.Connection, job_id: str) -> bool:
    return await conn.fetchval("SELECT 1 FROM pending_jobs WHERE job_id = $1", job_id) is not None


# --- preemption -------------------------------------------------------------------------------------------------
async def start_preemption(conn: asyncpg.Connection, job_id: str, replica: int | None, *, deadline: datetime,
                           reason: str, preemptor: str) -> list[tuple[asyncpg.Record, list[asyncpg.Record]]]:
    """Mark the job's live allocations (one replica's, or all of a gang's) as being preempted."""
    allocs = await conn.fetch(
        f"""UPDATE allocations SET preempt_deadline = $3, preempt_reason = $4, preempted_by = $5
            WHERE job_id = $1 AND released_at IS NULL AND preempt_deadline IS NULL
              AND ($2::int IS NULL OR replica = $2)
            RETURNING {_ALLOCATION}""", job_id, replica, deadline, reason, preemptor)
    out = []
    for alloc in allocs:
        gpus = await conn.fetch(f"SELECT {_HELD} FROM allocation_gpus WHERE allocation_id = $1 ORDER BY gpu_index",
                                alloc["allocation_id"])
        out.append((alloc, [held_gpu(g) for g in gpus]))
    return out


async def allocation(conn: asyncpg.Connection, allocation_id: str) -> asyncpg.Record | None:
    return await conn.fetchrow(
        """SELECT a.allocation_id, a.job_id, a.replica, a.released_at, coalesce(p.replicas, 1) AS replicas
           FROM allocations a LEFT JOIN pending_jobs p USING (job_id) WHERE a.allocation_id = $1""", allocation_id)


async def due_preemptions(conn: asyncpg.Connection, now: datetime) -> list[asyncpg.Record]:
    return await conn.fetch(
        """SELECT allocation_id, job_id, replica, preempt_reason FROM allocations
           WHERE released_at IS NULL AND preempt_deadline IS NOT NULL AND preempt_deadline <= $1""", now)


# --- the policy, learned from the quota service -----------------------------------------------------------------
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


# --- reads ------------------------------------------------------------------------------------------------------
async def list_allocations(conn: asyncpg.Connection, *, job_id: str | None, active: bool | None, limit: int,
                           after: str | None) -> list[asyncpg.Record]:
    return await conn.fetch(
        """SELECT a.allocation_id, a.job_id, a.replica, a.team, a.project, a.cluster, a.node, a.granted_at,
                  a.released_at, a.release_reason, a.preempt_deadline,
                  coalesce(json_agg(json_build_object('uuid', g.gpu_uuid, 'index', g.gpu_index, 'model', g.model,
                                             'share_milli', g.share_milli, 'memory_mib', g.memory_mib,
                                             'mig_profile', g.mig_profile, 'mig_start', g.mig_start)
                           ORDER BY g.gpu_index) FILTER (WHERE g.gpu_uuid IS NOT NULL), '[]') AS gpus
           FROM allocations a LEFT JOIN allocation_gpus g USING (allocation_id)
           WHERE ($1::text IS NULL OR a.job_id = $1)
             AND ($2::boolean IS NULL OR (a.released_at IS NULL) = $2)
             AND ($3::text IS NULL OR a.allocation_id > $3)
           GROUP BY a.allocation_id ORDER BY a.allocation_id LIMIT $4""",
        job_id, active, after, limit)


async def explain(conn: asyncpg.Connection, job_id: str) -> dict | None:
    """What placement knows about a job: waiting (reason, position) and/or holding GPUs (and any preemption)."""
    wanted = await conn.fetchrow(
        """SELECT job_id, replicas, satisfied, priority, priority_class, reason, message,
                  (SELECT count(*) FROM pending_jobs p2 WHERE NOT p2.satisfied AND (p2.priority > p.priority
                      OR (p2.priority = p.priority AND (p2.submitted_at, p2.job_id) < (p.submitted_at, p.job_id))))
                      AS ahead
           FROM pending_jobs p WHERE job_id = $1""", job_id)
    allocs = await conn.fetch(
        """SELECT allocation_id, replica, node, released_at, release_reason, preempt_deadline, preempt_reason,
                  preempted_by FROM allocations WHERE job_id = $1 ORDER BY granted_at DESC""", job_id)
    if wanted is None and not allocs:
        return None
    live = [a for a in allocs if a["released_at"] is None]
    doc: dict = {"replicas_wanted": wanted["replicas"] if wanted else None, "replicas_running": len(live),
                 "allocations": [a["allocation_id"] for a in live]}
    if wanted is not None and not wanted["satisfied"]:
        doc.update(state="pending", reason=wanted["reason"] or "Queued",
                   message=wanted["message"] or "waiting for the next scheduling cycle",
                   position=int(wanted["ahead"]) + 1, priority=wanted["priority"],
                   priority_class=wanted["priority_class"],
                   preempting_for_it=[r["job_id"] for r in await conn.fetch(
                       """SELECT DISTINCT job_id FROM allocations WHERE released_at IS NULL
                          AND (preempted_by = $1 OR preempted_by LIKE $1 || '#%')""", job_id)])
        return doc
    preempting = [a for a in live if a["preempt_deadline"] is not None]
    if preempting:
        a = preempting[0]
        doc.update(state="allocated", reason=a["preempt_reason"], preemptor_job_id=a["preempted_by"].split("#")[0],
                   message=f"being preempted for job {a['preempted_by']}; GPUs taken back at "
                           f"{a['preempt_deadline'].isoformat()}", deadline=a["preempt_deadline"].isoformat())
    elif live:
        doc.update(state="allocated", reason="Running",
                   message=f"holding GPUs on {', '.join(sorted({a['node'] for a in live}))}")
    else:
        doc.update(state="released", reason=allocs[0]["release_reason"],
                   message=f"released at {allocs[0]['released_at'].isoformat()}")
    return doc


# --- decisions (recorded cycles) ----------------------------------------------------------------------------------
async def record_decision(conn: asyncpg.Connection, *, cycle_id: str, decided_at: datetime, policy: str,
                          input_digest: str, plan_digest: str, input_gz: bytes, plan_json: str, summary: str,
                          keep: int) -> None:
    await conn.execute(
        """INSERT INTO decisions (cycle_id, decided_at, policy, input_digest, plan_digest, input_gz, plan_json,
                                  summary) VALUES ($1,$2,$3,$4,$5,$6,$7,$8::jsonb)""",
        cycle_id, decided_at, policy, input_digest, plan_digest, input_gz, plan_json, summary)
    await conn.execute(
        """DELETE FROM decisions WHERE cycle_id < (SELECT cycle_id FROM decisions ORDER BY cycle_id DESC
                                                    OFFSET $1 LIMIT 1)""", keep - 1)


async def list_decisions(conn: asyncpg.Connection, *, limit: int, before: str | None) -> list[asyncpg.Record]:
    return await conn.fetch(
        """SELECT cycle_id, summary FROM decisions WHERE ($1::text IS NULL OR cycle_id < $1)
           ORDER BY cycle_id DESC LIMIT $2""", before, limit)


async def get_decision(conn: asyncpg.Connection, cycle_id: str) -> asyncpg.Record | None:
    return await conn.fetchrow("SELECT cycle_id, summary, input_gz, plan_json FROM decisions WHERE cycle_id = $1",
                               cycle_id)
