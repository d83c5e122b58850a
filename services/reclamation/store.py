"""Every SQL statement of the reclamation service."""

from __future__ import annotations

from datetime import datetime

import asyncpg

from libs.contracts.commands import SetReclaimPolicy
from libs.contracts.events import AllocationGranted

# A tracker with what telemetry learned of it (tracker_usage, written only by the telemetry consumer: see the
# migration 0004 and README "Batched event handling"). Readers join; nobody locks both.
_TRACKER = ("""SELECT t.allocation_id, t.job_id, t.team, t.cluster, t.node, t.gpu_uuids, t.granted_at,
                      greatest(t.last_busy_at, u.last_busy_at) AS last_busy_at, u.last_sample_at, u.mean_util_pct,
                      u.max_util_pct, t.kind, t.priority_class, t.max_runtime_s, t.warned_at, t.reclaim_deadline,
                      t.reclaim_reason
               FROM trackers t LEFT JOIN tracker_usage u ON u.allocation_id = t.allocation_id""")


async def track(conn: asyncpg.Connection, data: AllocationGranted) -> None:
    await conn.execute(
        """INSERT INTO trackers (allocation_id, job_id, team, cluster, node, gpu_uuids, granted_at, last_busy_at,
                                 kind, priority_class, max_runtime_s)
           VALUES ($1,$2,$3,$4,$5,$6,$7,$7,$8,$9,$10) ON CONFLICT DO NOTHING""",
        data.allocation_id, data.job_id, data.team, data.cluster, data.node, [g.uuid for g in data.gpus],
        data.granted_at, data.kind, data.priority_class, data.max_runtime_s)


async def untrack(conn: asyncpg.Connection, allocation_id: str) -> None:
    await conn.execute("DELETE FROM trackers WHERE allocation_id = $1", allocation_id)


async def trackers_on_node(conn: asyncpg.Connection, cluster: str, node: str) -> list[asyncpg.Record]:
    return await conn.fetch(f"{_TRACKER} WHERE t.cluster = $1 AND t.node = $2", cluster, node)


async def tracked_on_node(conn: asyncpg.Connection, cluster: str, node: str) -> list[asyncpg.Record]:
    """What telemetry needs of the node's trackers (read without locks)."""
    return await conn.fetch("SELECT allocation_id, kind, gpu_uuids FROM trackers WHERE cluster = $1 AND node = $2",
                            cluster, node)


async def trackers_holding(conn: asyncpg.Connection, gpu_uuid: str) -> list[asyncpg.Record]:
    return await conn.fetch(f"{_TRACKER} WHERE $1 = ANY(t.gpu_uuids)", gpu_uuid)


async def abnormal_count(conn: asyncpg.Connection, job_id: str) -> int:
    return await conn.fetchval("SELECT coalesce(max(abnormal), 0) FROM job_restarts WHERE job_id = $1", job_id)


async def count_abnormal(conn: asyncpg.Connection, job_id: str, at: datetime) -> int:
    """One more abnormal loss of GPUs for this job; returns how many it has had."""
    return await conn.fetchval(
        """INSERT INTO job_restarts (job_id, abnormal, last_at) VALUES ($1, 1, $2)
           ON CONFLICT (job_id) DO UPDATE SET abnormal = job_restarts.abnormal + 1, last_at = EXCLUDED.last_at
           RETURNING abnormal""", job_id, at)


async def observe(conn: asyncpg.Connection, at: datetime,
                  observations: list[tuple[str, float, float, bool]]) -> None:
    """One sample for several allocations ((allocation id, mean, max, busy) each), in one statement in allocation
    id order. It writes only tracker_usage, so it never waits on a row the allocation consumer or the sweep
    holds; a tracker released meanwhile gets no usage row (its leftover one, if any, is pruned by the sweep).
    Idempotent: timestamps only move forward (greatest() ignores NULLs); utilisation is last-write-wins."""
    if not observations:
        return
    observations = sorted(observations)
    await conn.execute(
        """INSERT INTO tracker_usage AS u (allocation_id, last_sample_at, mean_util_pct, max_util_pct, last_busy_at)
           SELECT o.id, $1, o.mean, o.peak, CASE WHEN o.busy THEN $1::timestamptz END
           FROM unnest($2::text[], $3::real[], $4::real[], $5::bool[]) WITH ORDINALITY AS o(id, mean, peak, busy, n)
           WHERE EXISTS (SELECT 1 FROM trackers t WHERE t.allocation_id = o.id)
           ORDER BY o.n
           ON CONFLICT (allocation_id) DO UPDATE SET
               last_sample_at = greatest(u.last_sample_at, EXCLUDED.last_sample_at),
               mean_util_pct = EXCLUDED.mean_util_pct, max_util_pct = EXCLUDED.max_util_pct,
               last_busy_at = greatest(u.last_busy_at, EXCLUDED.last_busy_at)""",
        at, [o[0] for o in observations], [o[1] for o in observations], [o[2] for o in observations],
        [o[3] for o in observations])


async def prune_usage(conn: asyncpg.Connection) -> int:
    """Drop what telemetry kept of allocations no longer tracked. Rows another transaction holds are skipped (the
    next sweep gets them), so this never waits on the telemetry consumer."""
    status = await conn.execute(
        """DELETE FROM tracker_usage WHERE allocation_id IN (
               SELECT u.allocation_id FROM tracker_usage u
               WHERE NOT EXISTS (SELECT 1 FROM trackers t WHERE t.allocation_id = u.allocation_id)
               FOR UPDATE SKIP LOCKED)""")
    return int(status.split()[-1])


async def all_trackers(conn: asyncpg.Connection) -> list[asyncpg.Record]:
    return await conn.fetch(f"{_TRACKER} ORDER BY t.allocation_id")


async def mark_warned(conn: asyncpg.Connection, allocation_id: str, at: datetime, deadline: datetime) -> bool:
    status = await conn.execute(
        """UPDATE trackers SET warned_at = $2, reclaim_deadline = $3
           WHERE allocation_id = $1 AND warned_at IS NULL AND reclaim_reason IS NULL""", allocation_id, at, deadline)
    return status.endswith(" 1")


async def clear_warning(conn: asyncpg.Connection, allocation_id: str) -> None:
    await conn.execute("UPDATE trackers SET warned_at = NULL, reclaim_deadline = NULL WHERE allocation_id = $1 "
                       "AND reclaim_reason IS NULL", allocation_id)


async def mark_reclaiming(conn: asyncpg.Connection, allocation_id: str, reason: str) -> bool:
    status = await conn.execute(
        "UPDATE trackers SET reclaim_reason = $2 WHERE allocation_id = $1 AND reclaim_reason IS NULL",
        allocation_id, reason)
    return status.endswith(" 1")


async def reclaiming(conn: asyncpg.Connection) -> list[asyncpg.Record]:
    return await conn.fetch("SELECT allocation_id, reclaim_reason FROM trackers WHERE reclaim_reason IS NOT NULL")


async def policies(conn: asyncpg.Connection) -> dict[str, asyncpg.Record]:
    rows = await conn.fetch(
        "SELECT kind, idle_after_s, idle_util_pct, grace_s, enforce_max_runtime, updated_at FROM reclaim_policies")
    return {r["kind"]: r for r in rows}


async def set_policy(conn: asyncpg.Connection, cmd: SetReclaimPolicy) -> tuple[asyncpg.Record | None, asyncpg.Record]:
    before = await conn.fetchrow("SELECT kind, idle_after_s, idle_util_pct, grace_s, enforce_max_runtime "
                                 "FROM reclaim_policies WHERE kind = $1", cmd.kind)
    after = await conn.fetchrow(
        """INSERT INTO reclaim_policies (kind, idle_after_s, idle_util_pct, grace_s, enforce_max_runtime)
           VALUES ($1,$2,$3,$4,$5)
           ON CONFLICT (kind) DO UPDATE SET idle_after_s = EXCLUDED.idle_after_s,
               idle_util_pct = EXCLUDED.idle_util_pct, grace_s = EXCLUDED.grace_s,
               enforce_max_runtime = EXCLUDED.enforce_max_runtime, updated_at = now()
           RETURNING kind, idle_after_s, idle_util_pct, grace_s, enforce_max_runtime""",
        cmd.kind, cmd.idle_after_s, cmd.idle_util_pct, cmd.grace_s, cmd.enforce_max_runtime)
    return before, after
