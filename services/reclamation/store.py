"""Every SQL statement of the reclamation service."""

from __future__ import annotations

from datetime import datetime

import asyncpg

from libs.contracts.events import AllocationGranted


async def track(conn: asyncpg.Connection, data: AllocationGranted) -> None:
    await conn.execute(
        """INSERT INTO trackers (allocation_id, job_id, team, cluster, node, gpu_uuids, granted_at, last_busy_at)
           VALUES ($1,$2,$3,$4,$5,$6,$7,$7) ON CONFLICT DO NOTHING""",
        data.allocation_id, data.job_id, data.team, data.cluster, data.node, [g.uuid for g in data.gpus],
        data.granted_at)


async def untrack(conn: asyncpg.Connection, allocation_id: str) -> None:
    await conn.execute("DELETE FROM trackers WHERE allocation_id = $1", allocation_id)


async def trackers_on_node(conn: asyncpg.Connection, cluster: str, node: str) -> list[asyncpg.Record]:
    return await conn.fetch("SELECT allocation_id, gpu_uuids FROM trackers WHERE cluster = $1 AND node = $2",
                            cluster, node)


async def observe(conn: asyncpg.Connection, allocation_id: str, at: datetime, mean_util: float, busy: bool) -> None:
    await conn.execute(
        """UPDATE trackers SET last_sample_at = greatest(coalesce(last_sample_at, $2), $2), mean_util_pct = $3,
               last_busy_at = CASE WHEN $4 THEN greatest(last_busy_at, $2) ELSE last_busy_at END
           WHERE allocation_id = $1""", allocation_id, at, mean_util, busy)


async def list_trackers(conn: asyncpg.Connection) -> list[asyncpg.Record]:
    return await conn.fetch(
        """SELECT allocation_id, job_id, team, cluster, node, gpu_uuids, granted_at, last_busy_at, last_sample_at,
                  mean_util_pct, extract(epoch FROM (coalesce(last_sample_at, now()) - last_busy_at)) AS idle_s
           FROM trackers ORDER BY allocation_id""")
