"""Every SQL statement of the placement service."""

from __future__ import annotations

import json
import logging
from datetime import datetime
from typing import Any

import asyncpg

from libs.contracts.events import AllocatedGpu, JobSubmitted, NodeRegistered, PriorityClassSet, QuotaSet
from services.placement.domain import nvlink_domains
from services.placement.incremental import WantedJobs

log = logging.getLogger(__name__)

_INT_MAX = 2**31 - 1
_ALLOCATION = "allocation_id, job_id, replica, team, project, cluster, node, granted_at, released_at"
# what an allocation holds of one GPU, as AllocatedGpu's fields
_HELD = ("gpu_uuid AS uuid, gpu_index AS index, model, share_milli, memory_mib, mig_profile, mig_start")
_HELD_FIELDS = ("uuid", "index", "model", "share_milli", "memory_mib", "mig_profile", "mig_start")


def held_gpu(row: asyncpg.Record) -> AllocatedGpu:
    return AllocatedGpu(**dict(row))


class AllocationConflict(Exception):
    """The database refused an allocation (a GPU already held, or the replica already placed): the plan was
    stale. The unit of work rolls back; nothing half-applied remains."""


# --- the pool ---------------------------------------------------------------------------------------------------
async def upsert_node(conn: asyncpg.Connection, data: NodeRegistered) -> None:
    """The node's labels, address, CPUs and memory are what its latest registration says (the isolation drivers
    its agent can run now, where its peers reach it, what its host has for jobs' CPU and memory requests)."""
    await conn.execute(
        """INSERT INTO nodes (cluster, node, labels, address, cpu_milli, memory_mib)
           VALUES ($1, $2, $3::jsonb, $4, $5, $6)
           ON CONFLICT (cluster, node) DO UPDATE SET labels = EXCLUDED.labels, address = EXCLUDED.address,
               cpu_milli = EXCLUDED.cpu_milli, memory_mib = EXCLUDED.memory_mib, updated_at = now()""",
        data.cluster, data.node, json.dumps(data.labels, sort_keys=True), data.address,
        min(data.cpu_count * 1000, _INT_MAX), min(data.memory_mib, _INT_MAX))
    domains = nvlink_domains(data.gpus)
    for g in data.gpus:
        await conn.execute(
            """INSERT INTO gpus (uuid, cluster, node, idx, model, memory_mib, health, sharing, numa_node,
                                 nvlink_domain)
               VALUES ($1,$2,$3,$4,$5,$6,$7,$8,$9,$10)
               ON CONFLICT (uuid) DO UPDATE SET cluster = EXCLUDED.cluster, node = EXCLUDED.node,
                   idx = EXCLUDED.idx, model = EXCLUDED.model, memory_mib = EXCLUDED.memory_mib,
                   health = EXCLUDED.health, numa_node = EXCLUDED.numa_node,
                   nvlink_domain = EXCLUDED.nvlink_domain,
                   sharing = CASE WHEN gpus.sharing_set_by_operator THEN gpus.sharing ELSE EXCLUDED.sharing END""",
            g.uuid, data.cluster, data.node, g.index, g.model, g.memory_mib, g.health,
            "mig" if g.mig_mode else "exclusive", g.numa_node, domains[g.index])


async def set_node_schedulable(conn: asyncpg.Connection, cluster: str, node: str, schedulable: bool) -> None:
    """Upsert, so a node-lost event handled before the node's registration (a redelivery) is not forgotten when
    the registration arrives (upsert_node leaves `schedulable` alone)."""
    await conn.execute(
        """INSERT INTO nodes (cluster, node, schedulable) VALUES ($1, $2, $3)
           ON CONFLICT (cluster, node) DO UPDATE SET schedulable = EXCLUDED.schedulable, updated_at = now()""",
        cluster, node, schedulable)


async def set_gpu_sharing(conn: asyncpg.Connection, uuid: str, mode: str, draining: bool) -> bool:
    """An operator's choice; it outlives re-registrations. `draining`: the GPU is being emptied for another mode
    and takes no new work. False when the GPU is not known (yet)."""
    return await conn.fetchval(
        "UPDATE gpus SET sharing = $2, draining = $3, sharing_set_by_operator = true WHERE uuid = $1 RETURNING true",
        uuid, mode, draining) is not None


async def set_gpu_health(conn: asyncpg.Connection, uuid: str, health: str) -> None:
    await conn.execute("UPDATE gpus SET health = $2 WHERE uuid = $1", uuid, health)


# --- wanted jobs ------------------------------------------------------------------------------------------------
async def add_pending(conn: asyncpg.Connection, data: JobSubmitted, traceparent: str | None) -> bool:
    """Want the job (again, after a requeue). False when it already finished, or still holds GPUs (a late or
    repeated submission is ignored). One statement: the checks and the upsert in one round trip."""
    return await conn.fetchval(
        """INSERT INTO pending_jobs (job_id, team, project, gpus, gpu_models, priority, submitted_at, traceparent,
                                    priority_class, kind, gang_nodes, gpus_per_node, replicas, max_runtime_s,
                                    gpu_fraction_milli, gpu_memory_mib, mig_profile, exclusive, work, attempt,
                                    isolation, replica_set, cpu_milli, memory_mib, node_selector, preemptible)
           SELECT $1::text, $2::text, $3::text, $4::int, $5::text[], $6::int, $7::timestamptz, $8::text, $9::text,
                  $10::text, $11::int, $12::int, $13::int, $14::float8, $15::int, $16::int, $17::text, $18::bool,
                  $19::text, $20::int, $21::text, $22::bool, $23::int, $24::int, $25::jsonb, $26::bool
           WHERE NOT EXISTS (SELECT 1 FROM finished_jobs WHERE job_id = $1)
             AND NOT EXISTS (SELECT 1 FROM allocations WHERE job_id = $1 AND released_at IS NULL)
           ON CONFLICT (job_id) DO UPDATE SET satisfied = false, reason = NULL, message = NULL, facts = NULL,
                                              work = EXCLUDED.work, attempt = EXCLUDED.attempt,
                                              isolation = EXCLUDED.isolation
           RETURNING true""",
        data.job_id, data.team, data.project, data.gpus, data.gpu_models, data.priority, data.submitted_at,
        traceparent, data.priority_class, data.kind, data.gang_nodes, data.gpus_per_node, data.replicas,
        data.max_runtime_s, data.gpu_fraction_milli, data.gpu_memory_mib, data.mig_profile, data.exclusive,
        data.work.model_dump_json() if data.work is not None else None, data.attempt,
        data.work.isolation if data.work is not None else None, data.replica_set or data.replicas > 1,
        data.cpu_milli, data.memory_mib, json.dumps(data.node_selector, sort_keys=True),
        data.preemptible) is not None


# The pool as a cycle reads it: nodes, GPUs, live allocations (the snapshot's parts, shared by _STATE and _POOL).
_NODES_GPUS = """
  'nodes', (SELECT coalesce(json_agg(n ORDER BY n.cluster, n.node), '[]')
            FROM (SELECT cluster, node, schedulable, labels, address, cpu_milli, memory_mib FROM nodes) n),
  'gpus', (SELECT coalesce(json_agg(g), '[]')
           FROM (SELECT uuid, cluster, node, idx, model, memory_mib, health, sharing, draining, numa_node,
                        nvlink_domain FROM gpus) g)"""
# One live allocation as a cycle reads it (a WHERE clause may follow; `_LIVE_ROW_GROUP` closes it).
_LIVE_ROW = """
      SELECT a.allocation_id, a.job_id, a.replica, a.team, a.project, a.node, a.granted_at, a.priority,
             a.priority_class, a.kind, a.preempt_deadline, a.preempted_by, a.max_runtime_s, a.rendezvous_host,
             a.rendezvous_port, a.gang_wait, a.cpu_milli, a.memory_mib, a.preemptible,
             coalesce(p.replicas, 1) AS replicas, coalesce(p.replica_set, false) AS replica_set,
             array_agg(g.gpu_uuid ORDER BY g.gpu_index) AS gpu_uuids, min(g.model) AS gpu_model,
             min(g.share_milli) AS share_milli, max(g.memory_mib) AS gpu_memory_mib,
             array_agg(g.mig_profile ORDER BY g.gpu_index) AS mig_profiles,
             array_agg(g.mig_start ORDER BY g.gpu_index) AS mig_starts
      FROM allocations a JOIN allocation_gpus g USING (allocation_id) LEFT JOIN pending_jobs p USING (job_id)
      WHERE a.released_at IS NULL"""
_LIVE_ROW_GROUP = " GROUP BY a.allocation_id, p.replicas, p.replica_set"
_POOL_PARTS = _NODES_GPUS + """,
  'running', (SELECT coalesce(json_agg(r), '[]') FROM (""" + _LIVE_ROW + _LIVE_ROW_GROUP + """) r)"""

# The live allocations as a cycle reads them (`WantedJobs("allocation_id")`): how many there are, whole rows only of
# those changed at or above the horizon ($2) — the allocation's own row or its wanted job's (whose replicas it
# reads), or a wanted job gone meanwhile (`pending_gone`) — and the ids of those released at or above it. Nothing
# is read of the rest: every change is stamped with its transaction (`changed_xid`), and the count tells a copy
# that missed one.
_RUNNING_SINCE = """
  'running', json_build_object(
    'count', CASE WHEN $4::bool THEN (SELECT count(*) FROM allocations WHERE released_at IS NULL) END,
    'gone', (SELECT coalesce(json_agg(allocation_id), '[]') FROM allocations
             WHERE released_at IS NOT NULL AND changed_xid >= $2::text::xid8),
    'rows', (SELECT coalesce(json_agg(r), '[]') FROM (""" + _LIVE_ROW + """
            AND a.allocation_id IN (
              SELECT allocation_id FROM allocations WHERE released_at IS NULL AND changed_xid >= $2::text::xid8
              UNION SELECT c.allocation_id FROM allocations c JOIN pending_jobs w USING (job_id)
                    WHERE c.released_at IS NULL AND w.changed_xid >= $2::text::xid8
              UNION SELECT c.allocation_id FROM allocations c JOIN pending_gone d USING (job_id)
                    WHERE c.released_at IS NULL AND d.changed_xid >= $2::text::xid8)""" + \
            _LIVE_ROW_GROUP + """) r))"""

# The pool as a cycle reads it (`WantedJobs("key")`): how many nodes and GPUs there are, and whole nodes, each with
# its GPUs, only where the node or one of its GPUs changed at or above the horizon ($3). Nodes are never deleted;
# a GPU that moved to another node leaves the count of the one it left wrong, and the counts tell.
_NODES_SINCE = """
  'nodes', json_build_object(
    'count', CASE WHEN $4::bool THEN (SELECT count(*) FROM nodes) END,
    'gpus', CASE WHEN $4::bool THEN (SELECT count(*) FROM gpus) END,
    'rows', (SELECT coalesce(json_agg(r), '[]') FROM (
          SELECT n.cluster || chr(31) || n.node AS key, n.cluster, n.node, n.schedulable, n.labels, n.address,
                 n.cpu_milli, n.memory_mib,
                 coalesce(json_agg(json_build_object(
                     'uuid', g.uuid, 'cluster', g.cluster, 'node', g.node, 'idx', g.idx, 'model', g.model,
                     'memory_mib', g.memory_mib, 'health', g.health, 'sharing', g.sharing, 'draining', g.draining,
                     'numa_node', g.numa_node, 'nvlink_domain', g.nvlink_domain) ORDER BY g.idx, g.uuid)
                   FILTER (WHERE g.uuid IS NOT NULL), '[]') AS gpus
          FROM nodes n LEFT JOIN gpus g USING (cluster, node)
          WHERE n.changed_xid >= $3::text::xid8
             OR (n.cluster, n.node) IN (SELECT cluster, node FROM gpus WHERE changed_xid >= $3::text::xid8)
          GROUP BY n.cluster, n.node) r))"""

_STATE = """
SELECT json_build_object(""" + _NODES_SINCE + "," + _RUNNING_SINCE + """,
  'pending', json_build_object(
    'count', CASE WHEN $4::bool THEN (SELECT count(*) FROM pending_jobs WHERE NOT satisfied) END,
    'gone', (SELECT coalesce(json_agg(job_id), '[]') FROM pending_gone WHERE changed_xid >= $1::text::xid8),
    'rows', (SELECT coalesce(json_agg(q), '[]') FROM (
      SELECT job_id, team, project, gpus, gpu_models, priority, priority_class, kind, submitted_at, traceparent,
             gang_nodes, gpus_per_node, replicas, max_runtime_s, gpu_fraction_milli, gpu_memory_mib, mig_profile,
             exclusive, isolation, not_before, replica_failures, replica_set, cpu_milli, memory_mib, node_selector,
             preemptible, satisfied
      FROM pending_jobs WHERE changed_xid >= $1::text::xid8) q)),
  'xmin', pg_snapshot_xmin(pg_current_snapshot())::text,
  'usage', (SELECT coalesce(json_agg(u), '[]') FROM (SELECT team, gpu_model, gpu_seconds, as_of FROM team_usage) u),
  'teams', (SELECT coalesce(json_agg(t), '[]') FROM (SELECT team, org FROM policy_teams) t),
  'quotas', (SELECT coalesce(json_agg(q), '[]') FROM (
      SELECT path, gpu_model, guaranteed, borrowing_limit, lending_limit, weight FROM policy_quotas
      WHERE NOT deleted) q),
  'classes', (SELECT coalesce(json_agg(c), '[]')
              FROM (SELECT name, value, preemptible, min_runtime_s FROM policy_priority_classes) c),
  'policy_revision', greatest((SELECT max(revision) FROM policy_teams), (SELECT max(revision) FROM policy_quotas),
                              (SELECT max(revision) FROM policy_priority_classes))
)::text"""
_FLOATS = {"quotas": ("guaranteed", "borrowing_limit", "lending_limit", "weight"), "classes": ("min_runtime_s",),
           "running": ("max_runtime_s",), "pending": ("max_runtime_s",)}
_TIMES = {"running": ("granted_at", "preempt_deadline"), "pending": ("submitted_at", "not_before"),
          "usage": ("as_of",)}


# The pool and the shapes recently asked for (the last grants within the window, and every job still waiting),
# for the live fragmentation measure. A shape: GPUs on one node (a gang member's share), share of each GPU, the
# job's allowed models (when still known), MIG profile; `n`: how often it occurred.
_POOL = """
SELECT json_build_object(""" + _POOL_PARTS + """,
  'shapes', (SELECT coalesce(json_agg(s), '[]') FROM (
      SELECT gpus, share_milli, models, mig_profile, count(*) AS n FROM (
          SELECT count(*) AS gpus, min(g.share_milli) AS share_milli, coalesce(p.gpu_models, '{}') AS models,
                 coalesce(min(g.mig_profile), '') AS mig_profile
          FROM (SELECT allocation_id, job_id FROM allocations WHERE granted_at >= $1
                ORDER BY allocation_id DESC LIMIT $2) a
          JOIN allocation_gpus g USING (allocation_id) LEFT JOIN pending_jobs p USING (job_id)
          GROUP BY a.allocation_id, p.gpu_models
          UNION ALL
          SELECT CASE WHEN gang_nodes > 0 THEN gpus_per_node ELSE gpus END,
                 CASE WHEN gpu_fraction_milli > 0 THEN gpu_fraction_milli ELSE 1000 END, gpu_models, mig_profile
          FROM pending_jobs WHERE NOT satisfied) x
      GROUP BY gpus, share_milli, models, mig_profile) s)
)::text"""


async def load_pool(conn: asyncpg.Connection, since: datetime, recent: int) -> dict[str, Any]:
    """Nodes, GPUs and live allocations as a cycle reads them, with the job shapes asked for since `since` (at
    most the `recent` newest grants, and every waiting job), in one statement."""
    state = json.loads(await conn.fetchval(_POOL, since, recent))
    _convert(state)
    return state


async def load_state(conn: asyncpg.Connection, wanted: WantedJobs, live: WantedJobs | None = None,
                     pool: WantedJobs | None = None, counted: bool = True) -> dict[str, Any]:
    """Everything one scheduling cycle reads, as one statement: one consistent snapshot in one round trip (the
    cycle runs it every time it wakes, so the number of round trips is what it costs). Rows come back as dicts
    with the columns' Python types (timestamps as datetimes, double precision as floats).

    Of the wanted jobs only the rows changed since `wanted`'s last read come back (with thousands waiting, reading
    them all every cycle was most of a cycle's cost), with the jobs gone since (`pending_gone`) and how many are
    wanted; `state["pending"]` is the merged list. The same for the live allocations with `live` (a
    `WantedJobs("allocation_id")`; without one, all are read), and for the nodes with `pool` (a `WantedJobs("key")`:
    a node comes back whole, with its GPUs (`gpus`), only when it or one of its GPUs changed); `state["gpus"]` lists
    the GPUs of every node. If a merged copy does not hold as many as the store says, everything of it is read
    again. Counting them is a scan of each table: `counted=False` skips it (the copies are then taken as they are;
    a caller counts now and then, placement every second — a cycle that acts on a stale copy is refused by the
    store's constraints and locks, never double-allocates)."""
    live = live if live is not None else WantedJobs("allocation_id")
    pool = pool if pool is not None else WantedJobs("key")
    state = json.loads(await conn.fetchval(_STATE, wanted.horizon, live.horizon, pool.horizon, counted))
    pending, running, nodes = state["pending"], state["running"], state["nodes"]
    state["pending"], state["running"] = pending["rows"], running["rows"]
    _convert(state)
    xmin = state["xmin"]
    merged = wanted.merge([r for r in state["pending"] if not r["satisfied"]],
                          [r["job_id"] for r in state["pending"] if r["satisfied"]] + pending["gone"],
                          pending["count"], xmin)
    if merged is None:
        log.warning("wanted_jobs_reloaded", extra={"wanted": pending["count"]})
        return await load_state(conn, wanted, live, pool, counted)
    held = live.merge(state["running"], running["gone"], running["count"], xmin)
    if held is None:
        log.warning("live_allocations_reloaded", extra={"live": running["count"]})
        return await load_state(conn, wanted, live, pool, counted)
    known = pool.merge(nodes["rows"], (), nodes["count"], xmin, ordered=True)
    gpus = [g for n in known or () for g in n["gpus"]]
    if known is None or (nodes["gpus"] is not None and len(gpus) != nodes["gpus"]):
        pool.forget()
        log.warning("pool_reloaded", extra={"nodes": nodes["count"]})
        return await load_state(conn, wanted, live, pool, counted)
    state["pending"], state["running"], state["nodes"], state["gpus"] = merged, held, known, gpus
    return state


def _convert(state: dict[str, Any]) -> None:
    """JSON's numbers and strings back to the columns' types, for the parts `state` has."""
    for part, names in _FLOATS.items():
        for row in state.get(part, ()):
            for name in names:
                if row[name] is not None:
                    row[name] = float(row[name])
    for part, names in _TIMES.items():
        for row in state.get(part, ()):
            for name in names:
                if row[name] is not None:
                    row[name] = datetime.fromisoformat(row[name])


async def claim_jobs(conn: asyncpg.Connection, job_ids: list[str]) -> dict[str, asyncpg.Record]:
    """Lock the wanted jobs a cycle is about to place. A job no longer wanted or already satisfied is left out, and
    so is one whose row another transaction holds right now (an event about it being applied): it waits for the
    next cycle instead of this cycle waiting for that transaction."""
    rows = await conn.fetch(
        """SELECT job_id, team, project, priority, priority_class, kind, replicas, max_runtime_s, work, attempt,
                  preemptible
           FROM pending_jobs
           WHERE job_id = ANY($1::text[]) AND NOT satisfied ORDER BY job_id FOR UPDATE SKIP LOCKED""", job_ids)
    return {r["job_id"]: r for r in rows}


async def refresh_satisfied(conn: asyncpg.Connection, job_id: str, *, after_release: bool = False) -> bool:
    """satisfied = every wanted replica holds a live allocation; returns the new value. After a release only a
    replicated job wants its replica back by itself: a single job or a gang comes back only if the queue requeues
    it (it may instead end it, e.g. after an idle reclaim)."""
    return bool(await conn.fetchval(
        """UPDATE pending_jobs p SET satisfied = (SELECT count(*) FROM allocations a
                                                 WHERE a.job_id = p.job_id AND a.released_at IS NULL) >= p.replicas
           WHERE job_id = $1 AND (NOT $2 OR p.replica_set) RETURNING satisfied""", job_id, after_release))


async def refresh_satisfied_many(conn: asyncpg.Connection, job_ids: list[str]) -> None:
    """refresh_satisfied for the jobs a cycle placed, in one statement."""
    await conn.execute(
        """UPDATE pending_jobs p SET satisfied = (SELECT count(*) FROM allocations a
                                                 WHERE a.job_id = p.job_id AND a.released_at IS NULL) >= p.replicas
           WHERE job_id = ANY($1::text[])""", job_ids)


async def set_replicas(conn: asyncpg.Connection, job_id: str, replicas: int, replica_set: bool | None = None) -> int | None:
    """The job's new replica count (and whether it is a replica set at it; None: when it has more than one);
    during a rolling update the new target, with its surge replica kept on top. Returns the replicas now wanted
    (None: not a wanted job)."""
    return await conn.fetchval(
        """UPDATE pending_jobs SET replicas = CASE WHEN rollout_target IS NULL THEN $2 ELSE $2 + 1 END,
                                   rollout_target = CASE WHEN rollout_target IS NULL THEN NULL ELSE $2 END,
                                   replica_set = coalesce($3, $2 > 1)
           WHERE job_id = $1 RETURNING replicas""", job_id, replicas, replica_set)


async def start_rollout(conn: asyncpg.Connection, job_id: str, work: str) -> bool:
    """The job's new work; a replicated job with replicas live on other work starts rolling (one surge replica).
    True when a rollout runs."""
    return bool(await conn.fetchval(
        """WITH j AS (
               SELECT job_id, coalesce(rollout_target, replicas) AS target,
                      replica_set AND EXISTS (SELECT 1 FROM allocations a
                                               WHERE a.job_id = p.job_id AND a.released_at IS NULL
                                                 AND a.work IS DISTINCT FROM $2) AS rolls
               FROM pending_jobs p WHERE job_id = $1)
           UPDATE pending_jobs p SET work = $2, rollout_target = CASE WHEN j.rolls THEN j.target END,
                                     replicas = j.target + CASE WHEN j.rolls THEN 1 ELSE 0 END
           FROM j WHERE p.job_id = j.job_id RETURNING j.rolls""", job_id, work))


async def rolling_jobs(conn: asyncpg.Connection) -> list[asyncpg.Record]:
    return await conn.fetch("""SELECT job_id, work, rollout_target FROM pending_jobs
                               WHERE rollout_target IS NOT NULL ORDER BY job_id FOR UPDATE""")


async def rollout_members(conn: asyncpg.Connection, job_id: str) -> list[asyncpg.Record]:
    return await conn.fetch(
        """SELECT allocation_id, replica, work, coalesce(endpoint_ready, false) AS ready, preempt_deadline
           FROM allocations WHERE job_id = $1 AND released_at IS NULL ORDER BY replica""", job_id)


async def finish_rollout(conn: asyncpg.Connection, job_id: str) -> int:
    """The rollout is over: the job wants its target again. Returns it."""
    return await conn.fetchval(
        """UPDATE pending_jobs SET replicas = rollout_target, rollout_target = NULL
           WHERE job_id = $1 AND rollout_target IS NOT NULL RETURNING replicas""", job_id)


async def insert_allocations(conn: asyncpg.Connection, allocations: list[tuple], gpus: list[tuple]) -> None:
    """Insert allocations and the GPU shares they hold, all in two pipelined statements (one round trip each).
    `allocations`: (allocation_id, job_id, replica, team, project, cluster, node, granted_at, priority,
    priority_class, kind, max_runtime_s, work, attempt, rendezvous_host, rendezvous_port, rendezvous_env,
    gang_wait, cpu_milli, memory_mib, preemptible); `gpus`: (allocation_id, uuid, index, model, share_milli, memory_mib,
    mig_profile, mig_start, mig_slots). Any refusal (a GPU held, a replica already placed) fails them all."""
    try:
        await conn.executemany(
            """INSERT INTO allocations (allocation_id, job_id, replica, team, project, cluster, node, granted_at,
                                       priority, priority_class, kind, max_runtime_s, work, attempt,
                                       rendezvous_host, rendezvous_port, rendezvous_env, gang_wait, cpu_milli,
                                       memory_mib, preemptible)
               VALUES ($1,$2,$3,$4,$5,$6,$7,$8,$9,$10,$11,$12,$13,$14,$15,$16,$17,$18,$19,$20,$21)""",
            allocations)
        await conn.executemany(
            """INSERT INTO allocation_gpus (allocation_id, gpu_uuid, gpu_index, model, share_milli, memory_mib,
                                           mig_profile, mig_start, mig_slots)
               VALUES ($1,$2,$3,$4,$5,$6,$7,$8,$9)""", gpus)
    except asyncpg.UniqueViolationError as exc:
        raise AllocationConflict(str(exc)) from exc


async def insert_allocation(conn: asyncpg.Connection, allocation_id: str, job: asyncpg.Record, replica: int,
                            cluster: str, node: str, gpus: list[AllocatedGpu], granted_at: datetime,
                            mig_slots: dict[str, int]) -> None:
    await insert_allocations(
        conn, [(allocation_id, job["job_id"], replica, job["team"], job["project"], cluster, node, granted_at,
                job["priority"], job["priority_class"], job["kind"], job["max_runtime_s"], job.get("work"),
                job.get("attempt", 0), None, None, None, False, job.get("cpu_milli", 0), job.get("memory_mib", 0),
                job.get("preemptible"))],
        [(allocation_id, g.uuid, g.index, g.model, g.share_milli, g.memory_mib, g.mig_profile, g.mig_start,
          mig_slots.get(g.uuid)) for g in gpus])


async def record_pending_reasons(conn: asyncpg.Connection, reasons: list[tuple]) -> None:
    """(job_id, reason, message[, facts JSON or None]) for each job whose reason changed, in one statement."""
    await conn.execute(
        """UPDATE pending_jobs p SET reason = r.reason, message = r.message, facts = r.facts::jsonb
           FROM unnest($1::text[], $2::text[], $3::text[], $4::text[]) AS r(job_id, reason, message, facts)
           WHERE p.job_id = r.job_id""",
        [x[0] for x in reasons], [x[1] for x in reasons], [x[2] for x in reasons],
        [x[3] if len(x) > 3 else None for x in reasons])


async def set_fair_share_half_life(conn: asyncpg.Connection, half_life_s: float) -> None:
    """The half-life every release decays a team's recorded usage with (placement's setting)."""
    await conn.execute(
        """INSERT INTO fair_share_config (id, half_life_s) VALUES (true, $1)
           ON CONFLICT (id) DO UPDATE SET half_life_s = EXCLUDED.half_life_s""", half_life_s)


async def record_queue_order(conn: asyncpg.Connection, job_ids: tuple[str, ...]) -> None:
    """The order the cycle tried the waiting jobs in (explain's positions: a job's counts the jobs ahead of it
    that still wait, so jobs placed or finished since need no new write). Sent as one text the server splits: as
    an array parameter the driver checked and encoded each of 10,000 ids on its own (an id with a newline in it
    goes as an array)."""
    text = "\n".join(job_ids)
    if job_ids and text.count("\n") == len(job_ids) - 1:
        ids, split = text, "string_to_array($1::text, E'\\n')"
    else:
        ids, split = list(job_ids), "$1::text[]"
    await conn.execute(
        f"""INSERT INTO queue_order (id, job_ids, decided_at) VALUES (true, {split}, now())
           ON CONFLICT (id) DO UPDATE SET job_ids = EXCLUDED.job_ids, decided_at = EXCLUDED.decided_at""", ids)


async def release(conn: asyncpg.Connection, job_id: str, reason: str, at: datetime, *,
                  replica: int | None = None, min_replica: int | None = None, allocation_id: str | None = None,
                  finished: bool = False, with_work: bool | None = None,
                  exit: str | None = None) -> list[tuple[asyncpg.Record, list[AllocatedGpu]]]:
    """Release the job's live allocations (all, one replica, replicas ≥ min_replica, or one allocation) and their
    GPUs, in one statement, adding the GPU-seconds they held to their team's usage (fair share's history, decayed
    with `fair_share_config`'s half-life). `finished`: the job is over; the same statement remembers it in `finished_jobs` (a late
    or redelivered submission never places it) and stops wanting it. `with_work`: only allocations that run work
    (True) or only those that do not (False); `exit`: how the work ended (JSON), kept with the release.

    The job's wanted row is locked first, in its own statement: a cycle placing the job right now holds it
    (`claim_jobs`) until it commits, and the release's statement, which starts after that, then sees the
    allocations the cycle wrote. In one statement they would be invisible to it, and a job cancelled while
    being placed would keep its GPUs."""
    released, _ = await _release(conn, job_id, reason, at, replica, min_replica, allocation_id, finished, with_work,
                                 exit, None)
    return released


async def release_or_stop(conn: asyncpg.Connection, job_id: str, reason: str, at: datetime, *, max_grace_s: float,
                          replica: int | None = None, min_replica: int | None = None,
                          allocation_id: str | None = None, finished: bool = False) -> tuple[Released, Released]:
    """`release` of the allocations that run no work and `request_stop` of those that do, in the same statement
    (the two touch disjoint rows): (released, asked to stop)."""
    return await _release(conn, job_id, reason, at, replica, min_replica, allocation_id, finished, False, None,
                          max_grace_s)


Released = list[tuple[asyncpg.Record, list[AllocatedGpu]]]


async def _release(conn: asyncpg.Connection, job_id: str, reason: str, at: datetime, replica: int | None,
                   min_replica: int | None, allocation_id: str | None, finished: bool, with_work: bool | None,
                   exit: str | None, stop_grace_s: float | None) -> tuple[Released, Released]:
    await conn.execute("SELECT 1 FROM pending_jobs WHERE job_id = $1 FOR UPDATE", job_id)
    rows = await conn.fetch(
        f"""WITH a AS (
                UPDATE allocations SET released_at = $2, release_reason = $3, exit = $9
                WHERE job_id = $1 AND released_at IS NULL AND ($4::int IS NULL OR replica = $4)
                  AND ($5::int IS NULL OR replica >= $5) AND ($6::text IS NULL OR allocation_id = $6)
                  AND ($8::bool IS NULL OR (work IS NOT NULL) = $8)
                RETURNING {_ALLOCATION}, preempt_deadline),
            g AS (
                UPDATE allocation_gpus SET live = false FROM a WHERE allocation_gpus.allocation_id = a.allocation_id
                RETURNING allocation_gpus.allocation_id, {_HELD}),
            u AS (INSERT INTO team_usage AS t (team, gpu_model, gpu_seconds, as_of)
                  SELECT a.team, g.model,
                         sum(g.share_milli / 1000.0 * greatest(0, extract(epoch FROM a.released_at - a.granted_at))),
                         $2
                  FROM a JOIN g USING (allocation_id) GROUP BY a.team, g.model
                  ON CONFLICT (team, gpu_model) DO UPDATE SET
                      gpu_seconds = t.gpu_seconds * power(0.5, greatest(0, extract(epoch FROM EXCLUDED.as_of - t.as_of))
                          / coalesce((SELECT half_life_s FROM fair_share_config), 604800)) + EXCLUDED.gpu_seconds,
                      as_of = greatest(t.as_of, EXCLUDED.as_of)),
            f AS (INSERT INTO finished_jobs (job_id) SELECT $1 WHERE $7 ON CONFLICT DO NOTHING),
            d AS (DELETE FROM pending_jobs WHERE $7 AND job_id = $1),
            s AS (  -- with a grace ($10): ask those that run work to stop, as request_stop does
                UPDATE allocations SET preempt_reason = $3,
                       preempt_deadline = least(coalesce(preempt_deadline, 'infinity'::timestamptz),
                           $2::timestamptz + make_interval(
                               secs => least(coalesce((work::jsonb->>'stop_grace_s')::float8, 30), $10::float8)))
                WHERE $10::float8 IS NOT NULL AND job_id = $1 AND released_at IS NULL AND work IS NOT NULL
                  AND ($4::int IS NULL OR replica = $4) AND ($5::int IS NULL OR replica >= $5)
                  AND ($6::text IS NULL OR allocation_id = $6)
                RETURNING {_ALLOCATION}, preempt_deadline)
            SELECT false AS stopping, a.*, g.uuid, g.index, g.model, g.share_milli, g.memory_mib, g.mig_profile,
                   g.mig_start
            FROM a LEFT JOIN g USING (allocation_id)
            UNION ALL
            SELECT true, s.*, h.uuid, h.index, h.model, h.share_milli, h.memory_mib, h.mig_profile, h.mig_start
            FROM s LEFT JOIN (SELECT allocation_id, {_HELD} FROM allocation_gpus) h USING (allocation_id)
            ORDER BY stopping, replica, allocation_id, index""",
        job_id, at, reason, replica, min_replica, allocation_id, finished, with_work, exit, stop_grace_s)
    out: tuple[Released, Released] = ([], [])
    for row in rows:
        into = out[1] if row["stopping"] else out[0]
        if not into or into[-1][0]["allocation_id"] != row["allocation_id"]:
            into.append((row, []))
        if row["uuid"] is not None:
            into[-1][1].append(AllocatedGpu(**{k: row[k] for k in _HELD_FIELDS}))
    return out


async def replica_failures(conn: asyncpg.Connection, job_id: str) -> tuple[int, int] | None:
    """(replicas, failures in a row) of a wanted job, its row locked; None if it is not wanted."""
    row = await conn.fetchrow("SELECT replica_set, replica_failures FROM pending_jobs WHERE job_id = $1 FOR UPDATE",
                              job_id)
    return None if row is None else (row["replica_set"], row["replica_failures"])


async def back_off(conn: asyncpg.Connection, job_id: str, failures: int, not_before: datetime) -> None:
    await conn.execute("UPDATE pending_jobs SET replica_failures = $2, not_before = $3 WHERE job_id = $1",
                       job_id, failures, not_before)


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


async def request_stop(conn: asyncpg.Connection, job_id: str, reason: str, at: datetime, *, max_grace_s: float,
                       replica: int | None = None, min_replica: int | None = None,
                       allocation_id: str | None = None) -> list[tuple[asyncpg.Record, list[AllocatedGpu]]]:
    """Ask for the job's live allocations that run work (all, one replica, replicas ≥ min_replica, or one
    allocation) to be stopped: a deadline of now + the work's stop grace (at most `max_grace_s`), never later than
    one already set, and the newest reason. Their GPUs are released when the agent reports the work ended."""
    allocs = await conn.fetch(
        f"""UPDATE allocations SET preempt_reason = $3,
                   preempt_deadline = least(coalesce(preempt_deadline, 'infinity'::timestamptz),
                       $2::timestamptz + make_interval(
                           secs => least(coalesce((work::jsonb->>'stop_grace_s')::float8, 30), $7::float8)))
            WHERE job_id = $1 AND released_at IS NULL AND work IS NOT NULL AND ($4::int IS NULL OR replica = $4)
              AND ($5::int IS NULL OR replica >= $5) AND ($6::text IS NULL OR allocation_id = $6)
            RETURNING {_ALLOCATION}, preempt_deadline""",
        job_id, at, reason, replica, min_replica, allocation_id, max_grace_s)
    return [(a, await _held(conn, a["allocation_id"])) for a in allocs]


async def _held(conn: asyncpg.Connection, allocation_id: str) -> list[AllocatedGpu]:
    gpus = await conn.fetch(f"SELECT {_HELD} FROM allocation_gpus WHERE allocation_id = $1 ORDER BY gpu_index",
                            allocation_id)
    return [held_gpu(g) for g in gpus]


async def work_allocation(conn: asyncpg.Connection, allocation_id: str) -> asyncpg.Record | None:
    """An allocation as the end of its work needs it (locked: the exit and a stop request may race)."""
    return await conn.fetchrow(
        """SELECT a.allocation_id, a.job_id, a.replica, a.released_at, a.preempt_reason, a.work IS NOT NULL AS runs,
                  coalesce(p.replicas, 1) AS replicas, coalesce(p.gang_nodes, 0) AS gang_nodes
           FROM allocations a LEFT JOIN pending_jobs p USING (job_id) WHERE a.allocation_id = $1
           FOR UPDATE OF a""", allocation_id)


async def gang_members(conn: asyncpg.Connection, allocation_id: str) -> list[asyncpg.Record]:
    """The live allocations of the job `allocation_id` belongs to, locked in one order (members reporting ready
    at once then wait for each other instead of deadlocking), each with the gang's size."""
    job_id = await conn.fetchval("SELECT job_id FROM allocations WHERE allocation_id = $1", allocation_id)
    if job_id is None:
        return []
    return await conn.fetch(
        f"""SELECT {', '.join('a.' + c for c in _ALLOCATION.split(', '))}, a.attempt, a.gang_wait, a.ready_at,
                   a.preempt_deadline, coalesce(p.gang_nodes, 0) AS gang_nodes
            FROM allocations a LEFT JOIN pending_jobs p USING (job_id)
            WHERE a.job_id = $1 AND a.released_at IS NULL ORDER BY a.allocation_id FOR UPDATE OF a""", job_id)


async def mark_ready(conn: asyncpg.Connection, allocation_id: str, at: datetime) -> None:
    await conn.execute("UPDATE allocations SET ready_at = coalesce(ready_at, $2) WHERE allocation_id = $1",
                       allocation_id, at)


async def start_gang(conn: asyncpg.Connection, allocation_ids: list[str]) -> list[list[AllocatedGpu]]:
    """End the members' wait; returns each one's GPUs (in the order given), for its announcement."""
    await conn.execute("UPDATE allocations SET gang_wait = false WHERE allocation_id = ANY($1::text[])",
                       allocation_ids)
    return [await _held(conn, a) for a in allocation_ids]


async def set_endpoint(conn: asyncpg.Connection, allocation_id: str, cluster: str, node: str, *, url: str,
                       ports: dict[str, int], ready: bool, at: datetime, reason: str) -> bool:
    """Record a replica's endpoint as its node's agent announced it; only for an allocation on that node, and never
    over a newer announcement. False: nothing recorded."""
    return await conn.fetchval(
        """UPDATE allocations SET endpoint_url = $4, endpoint_ports = $5, endpoint_ready = $6, endpoint_at = $7,
                                  endpoint_reason = $8
           WHERE allocation_id = $1 AND cluster = $2 AND node = $3 AND (endpoint_at IS NULL OR endpoint_at <= $7)
           RETURNING true""", allocation_id, cluster, node, url, json.dumps(ports), ready, at, reason) is not None


async def unstarted_gangs(conn: asyncpg.Connection, granted_before: datetime) -> list[str]:
    """Jobs with a live member still waiting for its gang since before `granted_before` (and not being stopped)."""
    rows = await conn.fetch(
        """SELECT DISTINCT job_id FROM allocations
           WHERE released_at IS NULL AND gang_wait AND preempt_deadline IS NULL AND granted_at < $1""",
        granted_before)
    return [r["job_id"] for r in rows]


async def live_count(conn: asyncpg.Connection, job_id: str) -> int:
    return await conn.fetchval("SELECT count(*) FROM allocations WHERE job_id = $1 AND released_at IS NULL", job_id)


async def allocation(conn: asyncpg.Connection, allocation_id: str) -> asyncpg.Record | None:
    return await conn.fetchrow(
        """SELECT a.allocation_id, a.job_id, a.replica, a.released_at, coalesce(p.replica_set, false) AS replica_set
           FROM allocations a LEFT JOIN pending_jobs p USING (job_id) WHERE a.allocation_id = $1""", allocation_id)


async def due_preemptions(conn: asyncpg.Connection, now: datetime, report_timeout_s: float) -> list[asyncpg.Record]:
    """Allocations whose preemption deadline passed. One that runs work is released by its exit (the agent kills
    it at the deadline and reports when the cgroup is empty), so it is due only `report_timeout_s` after its
    deadline: an agent that never reports must not hold the GPUs forever."""
    return await conn.fetch(
        """SELECT allocation_id, job_id, replica, preempt_reason, work IS NOT NULL AS runs FROM allocations
           WHERE released_at IS NULL AND preempt_deadline IS NOT NULL
             AND preempt_deadline <= $1::timestamptz - CASE WHEN work IS NULL THEN interval '0'
                                                            ELSE make_interval(secs => $2::float8) END""",
        now, report_timeout_s)


# --- the policy, learned from the quota service -----------------------------------------------------------------
async def drop_policy_beyond(conn: asyncpg.Connection, revision_max: int) -> int:
    """Forget policy rows with a revision the quota service never handed out (a forged event's): the owner's own
    answer, upserted next, takes their place. Returns how many went."""
    n = 0
    for table in ("policy_teams", "policy_quotas", "policy_priority_classes"):
        n += int((await conn.execute(f"DELETE FROM {table} WHERE revision > $1", revision_max)).split()[-1])
    return n


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
                           after: str | None, cluster: str | None = None,
                           node: str | None = None) -> list[asyncpg.Record]:
    return await conn.fetch(
        """SELECT a.allocation_id, a.job_id, a.replica, a.team, a.project, a.cluster, a.node, a.granted_at,
                  a.released_at, a.release_reason, a.preempt_deadline, a.preempt_reason, a.attempt, a.work, a.kind,
                  a.exit, a.rendezvous_env, a.gang_wait, a.endpoint_url, a.endpoint_ports, a.endpoint_ready,
                  a.endpoint_at, a.endpoint_reason, a.cpu_milli, a.memory_mib, a.preemptible,
                  coalesce(json_agg(json_build_object('uuid', g.gpu_uuid, 'index', g.gpu_index, 'model', g.model,
                                             'share_milli', g.share_milli, 'memory_mib', g.memory_mib,
                                             'mig_profile', g.mig_profile, 'mig_start', g.mig_start)
                           ORDER BY g.gpu_index) FILTER (WHERE g.gpu_uuid IS NOT NULL), '[]') AS gpus
           FROM allocations a LEFT JOIN allocation_gpus g USING (allocation_id)
           WHERE ($1::text IS NULL OR a.job_id = $1)
             AND ($2::boolean IS NULL OR (a.released_at IS NULL) = $2)
             AND ($3::text IS NULL OR a.allocation_id > $3)
             AND ($5::text IS NULL OR a.cluster = $5) AND ($6::text IS NULL OR a.node = $6)
           GROUP BY a.allocation_id ORDER BY a.allocation_id LIMIT $4""",
        job_id, active, after, limit, cluster, node)


async def explain(conn: asyncpg.Connection, job_id: str) -> dict | None:
    """What placement knows about a job: waiting (reason, position) and/or holding GPUs (and any preemption)."""
    wanted = await conn.fetchrow(
        """SELECT job_id, replicas, satisfied, priority, priority_class, reason, message, facts::text AS facts,
                  (SELECT (SELECT count(*) FROM unnest(o.job_ids[:array_position(o.job_ids, p.job_id)]) u(j)
                                 JOIN pending_jobs w ON w.job_id = u.j AND NOT w.satisfied)
                   FROM queue_order o WHERE p.job_id = ANY(o.job_ids)) AS position,
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
                   position=wanted["position"] or int(wanted["ahead"]) + 1,
                   facts=json.loads(wanted["facts"]) if wanted["facts"] else {},
                   position_basis="last_cycle" if wanted["position"] else "estimate", priority=wanted["priority"],
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
                          input_digest: str, plan_digest: str, record_gz: bytes, base_id: str | None, summary: str,
                          keep: int | None) -> None:
    """Record a cycle (its record, services/placement/recording.py: a keyframe, or a delta against `base_id`); with
    `keep`, also drop all but the newest `keep` (callers prune now and then, not on every record), except the
    keyframes the kept deltas need."""
    await conn.execute(
        """INSERT INTO decisions (cycle_id, decided_at, policy, input_digest, plan_digest, record_gz, base_id,
                                  summary) VALUES ($1,$2,$3,$4,$5,$6,$7,$8::jsonb)""",
        cycle_id, decided_at, policy, input_digest, plan_digest, record_gz, base_id, summary)
    if keep is not None:
        # and the wanted jobs deleted over an hour ago: a replica whose last read is older reads everything again
        await conn.execute("DELETE FROM pending_gone WHERE gone_at < now() - interval '1 hour'")
        await conn.execute(
            """DELETE FROM decisions d
               WHERE cycle_id < (SELECT cycle_id FROM decisions ORDER BY cycle_id DESC OFFSET $1 LIMIT 1)
                 AND NOT EXISTS (SELECT 1 FROM decisions k WHERE k.base_id = d.cycle_id)""", keep - 1)


async def list_decisions(conn: asyncpg.Connection, *, limit: int, before: str | None) -> list[asyncpg.Record]:
    return await conn.fetch(
        """SELECT cycle_id, summary FROM decisions WHERE ($1::text IS NULL OR cycle_id < $1)
           ORDER BY cycle_id DESC LIMIT $2""", before, limit)


async def get_decision(conn: asyncpg.Connection, cycle_id: str) -> asyncpg.Record | None:
    """The recorded cycle with its keyframe's record (`base_gz`) when it is a delta."""
    return await conn.fetchrow(
        """SELECT d.cycle_id, d.summary, d.input_gz, d.plan_json, d.record_gz, b.record_gz AS base_gz
           FROM decisions d LEFT JOIN decisions b ON b.cycle_id = d.base_id WHERE d.cycle_id = $1""", cycle_id)


async def analyze(conn: asyncpg.Connection) -> None:
    """Gather the planner's statistics now (autovacuum does so soon after tables grow; a benchmark that has just
    filled them must not have its reads planned for empty tables)."""
    await conn.execute("ANALYZE")
