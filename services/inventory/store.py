"""Every SQL statement of the inventory service."""

from __future__ import annotations

import json
from datetime import datetime

import asyncpg

from libs.contracts.commands import RegisterNode
from libs.contracts.events import GpuTelemetry


async def upsert_node(conn: asyncpg.Connection, cmd: RegisterNode, now: datetime) -> asyncpg.Record | None:
    """Insert or refresh the node (state back to `ready`) and its GPUs; returns the node's previous
    `state, lost_at` (None for a new node), read under the row lock."""
    await conn.execute("INSERT INTO clusters (cluster) VALUES ($1) ON CONFLICT DO NOTHING", cmd.cluster)
    previous = await conn.fetchrow(
        "SELECT state, lost_at FROM nodes WHERE cluster = $1 AND node = $2 FOR UPDATE", cmd.cluster, cmd.node)
    await conn.execute(
        """INSERT INTO nodes (cluster, node, hostname, cpu_count, memory_mib, driver_version, agent_version, labels,
                              state, registered_at, last_seen_at)
           VALUES ($1,$2,$3,$4,$5,$6,$7,$8::jsonb,'ready',$9,$9)
           ON CONFLICT (cluster, node) DO UPDATE SET hostname = EXCLUDED.hostname,
               cpu_count = EXCLUDED.cpu_count, memory_mib = EXCLUDED.memory_mib,
               driver_version = EXCLUDED.driver_version, agent_version = EXCLUDED.agent_version,
               labels = EXCLUDED.labels, state = 'ready', lost_at = NULL, registered_at = EXCLUDED.registered_at,
               last_seen_at = EXCLUDED.last_seen_at""",
        cmd.cluster, cmd.node, cmd.hostname, cmd.cpu_count, cmd.memory_mib, cmd.driver_version,
        cmd.agent_version, json.dumps(cmd.labels), now)
    for g in cmd.gpus:
        await conn.execute(
            """INSERT INTO gpus (uuid, cluster, node, idx, model, name, memory_mib, numa_node, nvlink_peers,
                                 mig_mode, health)
               VALUES ($1,$2,$3,$4,$5,$6,$7,$8,$9,$10,$11)
               ON CONFLICT (uuid) DO UPDATE SET cluster = EXCLUDED.cluster, node = EXCLUDED.node,
                   idx = EXCLUDED.idx, model = EXCLUDED.model, name = EXCLUDED.name,
                   memory_mib = EXCLUDED.memory_mib, numa_node = EXCLUDED.numa_node,
                   nvlink_peers = EXCLUDED.nvlink_peers, mig_mode = EXCLUDED.mig_mode, health = EXCLUDED.health""",
            g.uuid, cmd.cluster, cmd.node, g.index, g.model, g.name, g.memory_mib, g.numa_node, g.nvlink_peers,
            g.mig_mode, g.health)
    return previous


async def gpu_health(conn: asyncpg.Connection, cluster: str, node: str) -> dict[str, str]:
    rows = await conn.fetch("SELECT uuid, health FROM gpus WHERE cluster = $1 AND node = $2", cluster, node)
    return {r["uuid"]: r["health"] for r in rows}


async def set_gpu_health(conn: asyncpg.Connection, uuid: str, health: str, reasons: list[str]) -> None:
    await conn.execute("UPDATE gpus SET health = $2, health_reasons = $3 WHERE uuid = $1", uuid, health, reasons)


async def touch_node(conn: asyncpg.Connection, cluster: str, node: str, at: datetime, cpu_util: float | None,
                     mem_used: int | None) -> asyncpg.Record | None:
    """Record that the node reported; returns its `state, last_seen_at, lost_at` from before this report (read
    under the row lock, so a concurrent sweep and this report are serialised), or None for an unknown node."""
    previous = await conn.fetchrow(
        "SELECT state, last_seen_at, lost_at FROM nodes WHERE cluster = $1 AND node = $2 FOR UPDATE", cluster, node)
    if previous is None:
        return None
    await conn.execute(
        """UPDATE nodes SET last_seen_at = greatest(last_seen_at, $3), cpu_util_pct = $4, memory_used_mib = $5
           WHERE cluster = $1 AND node = $2""", cluster, node, at, cpu_util, mem_used)
    return previous


async def mark_lost(conn: asyncpg.Connection, cutoff: datetime, now: datetime) -> list[asyncpg.Record]:
    """Every ready node silent since before `cutoff` becomes lost; returns them. A concurrent sweep (another
    replica) re-checks `state = 'ready'` after waiting for the row lock, so each node is declared lost once."""
    return await conn.fetch(
        """UPDATE nodes SET state = 'lost', lost_at = $2
           WHERE state = 'ready' AND last_seen_at < $1
           RETURNING cluster, node, last_seen_at""", cutoff, now)


async def mark_ready(conn: asyncpg.Connection, cluster: str, node: str) -> None:
    await conn.execute("UPDATE nodes SET state = 'ready', lost_at = NULL WHERE cluster = $1 AND node = $2",
                       cluster, node)


async def upsert_samples(conn: asyncpg.Connection, at: datetime, samples: list[GpuTelemetry]) -> None:
    """Latest wins; an older sample arriving late never overwrites a newer one."""
    await conn.executemany(
        """INSERT INTO gpu_telemetry_latest (uuid, sampled_at, utilization_gpu_pct, utilization_memory_pct,
               memory_used_mib, temperature_c, power_w, sm_clock_mhz, ecc_volatile_sbe, ecc_volatile_dbe, xid_last,
               throttle_reasons, process_count)
           SELECT $1,$2,$3,$4,$5,$6,$7,$8,$9,$10,$11,$12,$13 WHERE EXISTS (SELECT 1 FROM gpus WHERE uuid = $1)
           ON CONFLICT (uuid) DO UPDATE SET sampled_at = EXCLUDED.sampled_at,
               utilization_gpu_pct = EXCLUDED.utilization_gpu_pct,
               utilization_memory_pct = EXCLUDED.utilization_memory_pct,
               memory_used_mib = EXCLUDED.memory_used_mib, temperature_c = EXCLUDED.temperature_c,
               power_w = EXCLUDED.power_w, sm_clock_mhz = EXCLUDED.sm_clock_mhz,
               ecc_volatile_sbe = EXCLUDED.ecc_volatile_sbe, ecc_volatile_dbe = EXCLUDED.ecc_volatile_dbe,
               xid_last = coalesce(EXCLUDED.xid_last, gpu_telemetry_latest.xid_last),
               throttle_reasons = EXCLUDED.throttle_reasons, process_count = EXCLUDED.process_count
           WHERE gpu_telemetry_latest.sampled_at <= EXCLUDED.sampled_at""",
        [(s.uuid, at, s.utilization_gpu_pct, s.utilization_memory_pct, s.memory_used_mib, s.temperature_c,
          s.power_w, s.sm_clock_mhz, s.ecc_volatile_sbe, s.ecc_volatile_dbe,
          s.xid_events[-1] if s.xid_events else None, s.throttle_reasons, s.process_count) for s in samples])


async def list_nodes(conn: asyncpg.Connection, *, cluster: str | None, limit: int,
                     after: str | None) -> list[dict]:
    nodes = await conn.fetch(
        """SELECT cluster, node, hostname, cpu_count, memory_mib, driver_version, agent_version, labels, state,
                  registered_at, last_seen_at, cpu_util_pct, memory_used_mib
           FROM nodes WHERE ($1::text IS NULL OR cluster = $1) AND ($2::text IS NULL OR cluster || '/' || node > $2)
           ORDER BY cluster, node LIMIT $3""", cluster, after, limit)
    if not nodes:
        return []
    gpus = await conn.fetch(
        """SELECT g.uuid, g.cluster, g.node, g.idx, g.model, g.name, g.memory_mib, g.numa_node, g.nvlink_peers,
                  g.mig_mode, g.health, g.health_reasons, t.sampled_at, t.utilization_gpu_pct,
                  t.utilization_memory_pct, t.memory_used_mib, t.temperature_c, t.power_w, t.ecc_volatile_sbe,
                  t.ecc_volatile_dbe, t.xid_last
           FROM gpus g LEFT JOIN gpu_telemetry_latest t USING (uuid)
           WHERE (g.cluster, g.node) IN (SELECT * FROM unnest($1::text[], $2::text[]))
           ORDER BY g.cluster, g.node, g.idx""",
        [n["cluster"] for n in nodes], [n["node"] for n in nodes])
    by_node: dict[tuple[str, str], list[dict]] = {}
    for g in gpus:
        by_node.setdefault((g["cluster"], g["node"]), []).append({
            "uuid": g["uuid"], "index": g["idx"], "model": g["model"], "name": g["name"],
            "memory_mib": g["memory_mib"], "numa_node": g["numa_node"], "nvlink_peers": list(g["nvlink_peers"]),
            "mig_mode": g["mig_mode"], "health": g["health"], "health_reasons": list(g["health_reasons"]),
            "telemetry": None if g["sampled_at"] is None else {
                "sampled_at": g["sampled_at"].isoformat(), "utilization_gpu_pct": g["utilization_gpu_pct"],
                "utilization_memory_pct": g["utilization_memory_pct"], "memory_used_mib": g["memory_used_mib"],
                "temperature_c": g["temperature_c"], "power_w": g["power_w"],
                "ecc_volatile_sbe": g["ecc_volatile_sbe"], "ecc_volatile_dbe": g["ecc_volatile_dbe"],
                "xid_last": g["xid_last"]},
        })
    return [{
        "cluster": n["cluster"], "node": n["node"], "hostname": n["hostname"], "cpu_count": n["cpu_count"],
        "memory_mib": n["memory_mib"], "driver_version": n["driver_version"], "agent_version": n["agent_version"],
        "labels": json.loads(n["labels"]) if isinstance(n["labels"], str) else n["labels"], "state": n["state"],
        "registered_at": n["registered_at"].isoformat(), "last_seen_at": n["last_seen_at"].isoformat(),
        "cpu_util_pct": n["cpu_util_pct"], "memory_used_mib": n["memory_used_mib"],
        "gpus": by_node.get((n["cluster"], n["node"]), []),
    } for n in nodes]


async def pool_by_model(conn: asyncpg.Connection, *, cluster: str | None, fresh_since: datetime,
                        in_use_above_pct: float) -> list[asyncpg.Record]:
    """Per (cluster, model): counts, and the uuids in use (a fresh sample above the threshold) and unhealthy (GPU
    health not `healthy`, or on a lost node) so a caller can intersect them with what it knows (allocations)."""
    return await conn.fetch(
        """WITH g AS (
               SELECT g.cluster, g.model, g.uuid, n.state = 'lost' AS on_lost_node,
                      g.health = 'healthy' AND n.state = 'ready' AS healthy,
                      coalesce(t.sampled_at >= $2 AND t.utilization_gpu_pct > $3, false) AS in_use
               FROM gpus g JOIN nodes n USING (cluster, node) LEFT JOIN gpu_telemetry_latest t USING (uuid)
               WHERE $1::text IS NULL OR g.cluster = $1)
           SELECT cluster, model, count(*) AS total, count(*) FILTER (WHERE healthy) AS healthy,
                  count(*) FILTER (WHERE on_lost_node) AS on_lost_nodes,
                  coalesce(array_agg(uuid ORDER BY uuid) FILTER (WHERE in_use), '{}') AS in_use_gpus,
                  coalesce(array_agg(uuid ORDER BY uuid) FILTER (WHERE NOT healthy), '{}') AS unhealthy_gpus
           FROM g GROUP BY cluster, model ORDER BY cluster, model""", cluster, fresh_since, in_use_above_pct)


async def pool_nodes(conn: asyncpg.Connection, *, cluster: str | None) -> list[asyncpg.Record]:
    return await conn.fetch(
        """SELECT n.cluster, n.node, n.hostname, n.state, n.last_seen_at, n.cpu_count, n.cpu_util_pct,
                  n.memory_mib, n.memory_used_mib, count(g.uuid) AS gpus
           FROM nodes n LEFT JOIN gpus g USING (cluster, node)
           WHERE $1::text IS NULL OR n.cluster = $1
           GROUP BY n.cluster, n.node ORDER BY n.cluster, n.node""", cluster)
