"""Every SQL statement of the reclamation service."""

from __future__ import annotations

from datetime import datetime

import asyncpg

from libs.contracts.commands import SetReclaimPolicy
from libs.contracts.events import AllocationGranted

_TRACKER = ("allocation_id, job_id, team, cluster, node, gpu_uuids, granted_at, last_busy_at, last_sample_at, "
            "mean_util_pct, max_util_pct, kind, priority_class, max_runtime_s, warned_at, reclaim_deadline, "
            "reclaim_reason")


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
    return await conn.fetch(f"SELECT {_TRACKER} FROM trackers WHERE cluster = $1 AND node = $2", cluster, node)


async def trackers_holding(conn: asyncpg.Connection, gpu_uuid: str) -> list[asyncpg.Record]:
    return await conn.fetch(f"SELECT {_TRACKER} FROM trackers WHERE $1 = ANY(gpu_uuids)", gpu_uuid)


async def abnormal_count(conn: asyncpg.Connection, job_id: str) -> int:
    return await conn.fetchval("SELECT coalesce(max(abnormal), 0) FROM job_restarts WHERE job_id = $1", job_id)


async def count_abnormal(conn: asyncpg.Connection, job_id: str, at: datetime) -> int:
    """One more abnormal loss of GPUs for this job; returns how many it has had."""
    return await conn.fetchval(
        """INSERT INTO job_restarts (job_id, abnormal, last_at) VALUES ($1, 1, $2)
           ON CONFLICT (job_id) DO UPDATE SET abnormal = job_restarts.abnormal + 1, last_at = EXCLUDED.last_at
           RETURNING abnormal""", job_id, at)


async def observe(conn: asyncpg.Connection, allocation_id: str, at: datetime, mean_util: float, max_util: float,
                  busy: bool) -> None:
    await conn.execute(
        """UPDATE trackers SET last_sample_at = greatest(coalesce(last_sample_at, $2), $2), mean_util_pct = $3,
               max_util_pct = $4, last_busy_at = CASE WHEN $5 THEN greatest(last_busy_at, $2) ELSE last_busy_at END
           WHERE allocation_id = $1""", allocation_id, at, mean_util, max_util, busy)


async def all_trackers(conn: asyncpg.Connection) -> list[asyncpg.Record]:
    return await conn.fetch(f"SELECT {_TRACKER} FROM trackers ORDER BY allocation_id")


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
