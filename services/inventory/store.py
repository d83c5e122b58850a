"""Every SQL statement of the inventory service."""

from __future__ import annotations

import json
from datetime import datetime

import asyncpg

from libs.contracts.commands import RegisterNode
from libs.contracts.events import GpuTelemetry
from services.inventory.domain import node_network, node_storage


async def upsert_node(conn: asyncpg.Connection, cmd: RegisterNode, now: datetime) -> asyncpg.Record | None:
    """Insert or refresh the node (state back to `ready`) and its GPUs; returns the node's previous
    `state, lost_at` (None for a new node), read under the row lock."""
    await conn.execute("INSERT INTO clusters (cluster) VALUES ($1) ON CONFLICT DO NOTHING", cmd.cluster)
    previous = await conn.fetchrow(
        "SELECT state, lost_at, cordoned FROM nodes WHERE cluster = $1 AND node = $2 FOR UPDATE",
        cmd.cluster, cmd.node)
    await conn.execute(
        """INSERT INTO nodes (cluster, node, hostname, cpu_count, memory_mib, driver_version, agent_version, labels,
                              state, registered_at, last_seen_at, network, storage, address)
           VALUES ($1,$2,$3,$4,$5,$6,$7,$8::jsonb,'ready',$9,$9,$10::jsonb,$11::jsonb,$12)
           ON CONFLICT (cluster, node) DO UPDATE SET hostname = EXCLUDED.hostname,
               cpu_count = EXCLUDED.cpu_count, memory_mib = EXCLUDED.memory_mib,
               driver_version = EXCLUDED.driver_version, agent_version = EXCLUDED.agent_version,
               labels = EXCLUDED.labels, state = 'ready', lost_at = NULL, registered_at = EXCLUDED.registered_at,
               last_seen_at = EXCLUDED.last_seen_at, network = EXCLUDED.network, storage = EXCLUDED.storage,
               address = EXCLUDED.address""",
        cmd.cluster, cmd.node, cmd.hostname, cmd.cpu_count, cmd.memory_mib, cmd.driver_version,
        cmd.agent_version, json.dumps(cmd.labels), now,
        json.dumps([nic.model_dump() for nic in cmd.network]), json.dumps([v.model_dump() for v in cmd.storage]),
        cmd.address)
    # The health state is inventory's (it survives agent restarts); the agent's own verdict arrives with its samples
    # and goes through the state machine like any other.
    await conn.executemany(
        # Sharing follows the GPU's MIG mode until an operator sets it, as placement derives it: a GPU in MIG mode
        # is shared by MIG slices.
        """INSERT INTO gpus (uuid, cluster, node, idx, model, name, memory_mib, numa_node, nvlink_peers,
                             mig_mode, state_since, sharing)
           VALUES ($1,$2,$3,$4,$5,$6,$7,$8,$9,$10,$11, CASE WHEN $10 THEN 'mig' ELSE 'exclusive' END)
           ON CONFLICT (uuid) DO UPDATE SET cluster = EXCLUDED.cluster, node = EXCLUDED.node,
               idx = EXCLUDED.idx, model = EXCLUDED.model, name = EXCLUDED.name,
               memory_mib = EXCLUDED.memory_mib, numa_node = EXCLUDED.numa_node,
               nvlink_peers = EXCLUDED.nvlink_peers, mig_mode = EXCLUDED.mig_mode,
               sharing = CASE WHEN gpus.sharing_set_by IS NULL THEN EXCLUDED.sharing ELSE gpus.sharing END""",
        [(g.uuid, cmd.cluster, cmd.node, g.index, g.model, g.name, g.memory_mib, g.numa_node, g.nvlink_peers,
          g.mig_mode, now) for g in cmd.gpus])
    return previous


async def node_gpu_states(conn: asyncpg.Connection, cluster: str, node: str) -> list[asyncpg.Record]:
    return await conn.fetch(
        "SELECT uuid, idx, state, health, sharing FROM gpus WHERE cluster = $1 AND node = $2 ORDER BY idx",
        cluster, node)


# --- telemetry, applied a batch at a time ----------------------------------------------------------------------
async def lock_nodes(conn: asyncpg.Connection, keys: list[tuple[str, str]]) -> dict[tuple[str, str], asyncpg.Record]:
    """Lock the batch's nodes (in key order, so concurrent batches never deadlock) and return their state from
    before this batch; nodes that never registered are absent."""
    rows = await conn.fetch(
        """SELECT n.cluster, n.node, n.state, n.last_seen_at, n.lost_at, n.cordoned
           FROM nodes n JOIN unnest($1::text[], $2::text[]) AS k(cluster, node) USING (cluster, node)
           ORDER BY n.cluster, n.node FOR UPDATE OF n""", [k[0] for k in keys], [k[1] for k in keys])
    return {(r["cluster"], r["node"]): r for r in rows}


# (cluster, node, at, cpu_util_pct, memory_used_mib, network_rx_mbps, network_tx_mbps, storage_used_gib)
NodeRow = tuple[str, str, datetime, float | None, int | None, float | None, float | None, float | None]


async def touch_nodes(conn: asyncpg.Connection, rows: list[NodeRow]) -> None:
    """Each node reported at `at` (its newest sample in the batch): last_seen_at and host CPU/memory/network/storage
    use, in one statement; a number the sample leaves out keeps its last value."""
    await conn.execute(
        """UPDATE nodes n SET last_seen_at = greatest(n.last_seen_at, u.at),
                              cpu_util_pct = coalesce(u.cpu, n.cpu_util_pct),
                              memory_used_mib = coalesce(u.mem, n.memory_used_mib),
                              network_rx_mbps = coalesce(u.rx, n.network_rx_mbps),
                              network_tx_mbps = coalesce(u.tx, n.network_tx_mbps),
                              storage_used_gib = coalesce(u.disk, n.storage_used_gib)
           FROM unnest($1::text[], $2::text[], $3::timestamptz[], $4::real[], $5::bigint[], $6::float8[],
                       $7::float8[], $8::float8[])
                AS u(cluster, node, at, cpu, mem, rx, tx, disk)
           WHERE n.cluster = u.cluster AND n.node = u.node""",
        *map(list, zip(*rows, strict=True)))


async def batch_gpus(conn: asyncpg.Connection, uuids: list[str]) -> dict[str, asyncpg.Record]:
    """The batch's GPUs with their health state and the previous sample's time and ECC counters. Not row-locked:
    whoever changes a GPU's health (a sample, an operator) holds its node's row lock first, which serialises them
    without writing a lock on thousands of GPU rows per second."""
    rows = await conn.fetch(
        """SELECT g.uuid, g.cluster, g.node, g.idx, g.state, g.state_since, g.state_reason, g.state_details,
                  g.last_signal_at, g.strikes, g.last_strike_at, g.health,
                  t.sampled_at, t.ecc_volatile_sbe, t.ecc_volatile_dbe
           FROM gpus g LEFT JOIN gpu_telemetry_latest t USING (uuid)
           WHERE g.uuid = ANY($1::text[])""", uuids)
    return {r["uuid"]: r for r in rows}


async def save_gpu_health(conn: asyncpg.Connection, rows: list[tuple]) -> None:
    """(uuid, state, since, reason, details, last_signal_at, strikes, last_strike_at, health) per changed GPU."""
    await conn.executemany(
        """UPDATE gpus SET state = $2, state_since = $3, state_reason = $4, state_details = $5, last_signal_at = $6,
                           strikes = $7, last_strike_at = $8, health = $9, health_reasons = $5
           WHERE uuid = $1""", rows)


# One GPU sample as apply_samples takes it (columns in this order).
# The last number: how many left-out samples (sampling by change, domain.held_samples) repeated the GPU's previous
# values in this sample's minute.
SampleRow = tuple[str, datetime, float, float, int, float | None, float | None, int | None, int, int, int | None, str,
                  int, int]


def sample_row(at: datetime, s: GpuTelemetry, held: int = 0) -> SampleRow:
    return (s.uuid, at, s.utilization_gpu_pct, s.utilization_memory_pct, s.memory_used_mib, s.temperature_c,
            s.power_w, s.sm_clock_mhz, s.ecc_volatile_sbe, s.ecc_volatile_dbe,
            s.xid_events[-1] if s.xid_events else None, ",".join(s.throttle_reasons), s.process_count, held)


_ROLLUP_ADD = """ON CONFLICT (uuid, window_start) DO UPDATE SET samples = r.samples + EXCLUDED.samples,
                   util_sum = r.util_sum + EXCLUDED.util_sum, util_max = greatest(r.util_max, EXCLUDED.util_max),
                   mem_sum = r.mem_sum + EXCLUDED.mem_sum, mem_max = greatest(r.mem_max, EXCLUDED.mem_max),
                   power_sum = r.power_sum + EXCLUDED.power_sum, power_n = r.power_n + EXCLUDED.power_n,
                   temp_max = greatest(r.temp_max, EXCLUDED.temp_max),
                   procs_max = greatest(r.procs_max, EXCLUDED.procs_max)
               WHERE NOT r.emitted"""  # a minute already emitted is closed and takes nothing more


async def apply_samples(conn: asyncpg.Connection, rows: list[SampleRow], rolled: list[tuple[str, int]]) -> None:
    """New GPU samples, at most one per GPU (each newer than its GPU's stored one; the caller holds their nodes'
    locks), in one statement. Each GPU's latest row takes the sample (keeping since when the GPU has run processes,
    and when it last did) and adds it to the sums of its open minute, kept on that row. `rolled`: the GPUs whose
    sample starts a later minute than their previous one — the minute their row holds is over, and moves to
    gpu_rollups first — each with how many left-out samples repeated its previous values before that minute ended
    (sampling by change); a row's own held count adds the previous values that many times to this sample's minute. (A row's open minute is always that of its `sampled_at`, or none once the rollup pass took it:
    the caller knows from the previous sample which rows roll over, so no other row is read.)"""
    await conn.execute(
        f"""WITH finished AS (
               INSERT INTO gpu_rollups AS r (uuid, window_start, cluster, node, idx, samples, util_sum, util_max,
                                             mem_sum, mem_max, power_sum, power_n, temp_max, procs_max)
               SELECT l.uuid, l.win_start, g.cluster, g.node, g.idx, l.win_samples + f.held,
                      l.win_util_sum + f.held * l.utilization_gpu_pct, l.win_util_max,
                      l.win_mem_sum + f.held * l.memory_used_mib, l.win_mem_max,
                      l.win_power_sum + f.held * coalesce(l.power_w, 0),
                      l.win_power_n + f.held * (l.power_w IS NOT NULL)::int, l.win_temp_max, l.win_procs_max
               FROM gpu_telemetry_latest l JOIN gpus g USING (uuid)
                    JOIN unnest($15::text[], $16::int[]) AS f(uuid, held) USING (uuid)
               WHERE l.win_start IS NOT NULL
               {_ROLLUP_ADD})
           INSERT INTO gpu_telemetry_latest AS l (uuid, sampled_at, utilization_gpu_pct, utilization_memory_pct,
               memory_used_mib, temperature_c, power_w, sm_clock_mhz, ecc_volatile_sbe, ecc_volatile_dbe, xid_last,
               throttle_reasons, process_count, procs_since, last_process_at, win_start, win_samples, win_util_sum,
               win_util_max, win_mem_sum, win_mem_max, win_power_sum, win_power_n, win_temp_max, win_procs_max)
           SELECT u.uuid, at, util, mutil, mem, temp, power, clock, sbe, dbe, xid,
                  coalesce(string_to_array(nullif(throttle, ''), ','), '{{}}'), procs,
                  CASE WHEN procs > 0 THEN at END, CASE WHEN procs > 0 THEN at END,
                  date_bin('1 minute', at, timestamptz '2000-01-01 00:00:00+00'),
                  1 + held, util + held * coalesce(p.utilization_gpu_pct, 0), greatest(util, p.utilization_gpu_pct),
                  mem + held * coalesce(p.memory_used_mib, 0), greatest(mem, p.memory_used_mib),
                  coalesce(power, 0) + held * coalesce(p.power_w, 0),
                  (power IS NOT NULL)::int + held * (p.power_w IS NOT NULL)::int,
                  greatest(temp, p.temperature_c), greatest(procs, p.process_count)
           FROM unnest($1::text[], $2::timestamptz[], $3::float8[], $4::float8[], $5::int[], $6::float8[],
                       $7::float8[], $8::int[], $9::bigint[], $10::bigint[], $11::int[], $12::text[], $13::int[],
                       $14::int[])
                AS u(uuid, at, util, mutil, mem, temp, power, clock, sbe, dbe, xid, throttle, procs, held)
                -- the previous sample (before this statement), repeated `held` times by an agent sampling by change
                LEFT JOIN gpu_telemetry_latest p ON p.uuid = u.uuid AND u.held > 0
           ON CONFLICT (uuid) DO UPDATE SET sampled_at = EXCLUDED.sampled_at,
               utilization_gpu_pct = EXCLUDED.utilization_gpu_pct,
               utilization_memory_pct = EXCLUDED.utilization_memory_pct,
               memory_used_mib = EXCLUDED.memory_used_mib, temperature_c = EXCLUDED.temperature_c,
               power_w = EXCLUDED.power_w, sm_clock_mhz = EXCLUDED.sm_clock_mhz,
               ecc_volatile_sbe = EXCLUDED.ecc_volatile_sbe, ecc_volatile_dbe = EXCLUDED.ecc_volatile_dbe,
               xid_last = coalesce(EXCLUDED.xid_last, l.xid_last),
               throttle_reasons = EXCLUDED.throttle_reasons, process_count = EXCLUDED.process_count,
               procs_since = CASE WHEN EXCLUDED.process_count > 0 THEN coalesce(l.procs_since, EXCLUDED.sampled_at)
                             END,
               last_process_at = CASE WHEN EXCLUDED.process_count > 0 THEN EXCLUDED.sampled_at
                                 ELSE l.last_process_at END,
               win_start = EXCLUDED.win_start,
               win_samples = EXCLUDED.win_samples + CASE WHEN l.win_start = EXCLUDED.win_start
                                                         THEN l.win_samples ELSE 0 END,
               win_util_sum = EXCLUDED.win_util_sum + CASE WHEN l.win_start = EXCLUDED.win_start
                                                           THEN l.win_util_sum ELSE 0 END,
               win_util_max = CASE WHEN l.win_start = EXCLUDED.win_start
                                   THEN greatest(l.win_util_max, EXCLUDED.win_util_max) ELSE EXCLUDED.win_util_max END,
               win_mem_sum = EXCLUDED.win_mem_sum + CASE WHEN l.win_start = EXCLUDED.win_start
                                                         THEN l.win_mem_sum ELSE 0 END,
               win_mem_max = CASE WHEN l.win_start = EXCLUDED.win_start
                                  THEN greatest(l.win_mem_max, EXCLUDED.win_mem_max) ELSE EXCLUDED.win_mem_max END,
               win_power_sum = EXCLUDED.win_power_sum + CASE WHEN l.win_start = EXCLUDED.win_start
                                                             THEN l.win_power_sum ELSE 0 END,
               win_power_n = EXCLUDED.win_power_n + CASE WHEN l.win_start = EXCLUDED.win_start
                                                         THEN l.win_power_n ELSE 0 END,
               win_temp_max = CASE WHEN l.win_start = EXCLUDED.win_start
                                   THEN greatest(l.win_temp_max, EXCLUDED.win_temp_max) ELSE EXCLUDED.win_temp_max END,
               win_procs_max = CASE WHEN l.win_start = EXCLUDED.win_start
                                    THEN greatest(l.win_procs_max, EXCLUDED.win_procs_max)
                                    ELSE EXCLUDED.win_procs_max END
           WHERE l.sampled_at < EXCLUDED.sampled_at""",
        *map(list, zip(*rows, strict=True)), [r[0] for r in rolled], [r[1] for r in rolled])


async def ready_reports(conn: asyncpg.Connection) -> tuple[datetime | None, int]:
    """The newest report of any ready node, and how many nodes are ready."""
    row = await conn.fetchrow("SELECT max(last_seen_at) AS newest, count(*) AS n FROM nodes WHERE state = 'ready'")
    return row["newest"], row["n"]


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


_GPU_VIEW = """SELECT g.uuid, g.cluster, g.node, g.idx, g.model, g.name, g.memory_mib, g.numa_node, g.nvlink_peers,
                  g.mig_mode, g.health, g.health_reasons, g.state, g.state_since, g.state_reason, g.state_details,
                  g.sharing, g.sharing_target, g.sharing_set_by, g.sharing_set_at, t.sampled_at, t.utilization_gpu_pct,
                  t.utilization_memory_pct, t.memory_used_mib, t.temperature_c, t.power_w, t.ecc_volatile_sbe,
                  t.ecc_volatile_dbe, t.xid_last, t.process_count,
                  (SELECT min(h.allocation_id) FROM held_gpus h WHERE h.gpu_uuid = g.uuid) AS allocation_id
           FROM gpus g LEFT JOIN gpu_telemetry_latest t USING (uuid)"""
_NODE_VIEW = """SELECT cluster, node, hostname, cpu_count, memory_mib, driver_version, agent_version, labels, state,
                  registered_at, last_seen_at, lost_at, cpu_util_pct, memory_used_mib, cordoned, cordoned_at,
                  cordoned_by, cordon_reason, drained, network, storage, network_rx_mbps, network_tx_mbps,
                  storage_used_gib, address FROM nodes"""


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def _gpu_view(g: asyncpg.Record) -> dict:
    return {
        "uuid": g["uuid"], "index": g["idx"], "model": g["model"], "name": g["name"],
        "memory_mib": g["memory_mib"], "numa_node": g["numa_node"], "nvlink_peers": list(g["nvlink_peers"]),
        "mig_mode": g["mig_mode"], "health": g["health"], "health_reasons": list(g["health_reasons"]),
        "state": g["state"], "state_since": _iso(g["state_since"]), "state_reason": g["state_reason"],
        "sharing": g["sharing"], "draining_to": g["sharing_target"], "allocation_id": g["allocation_id"],
        "telemetry": None if g["sampled_at"] is None else {
            "sampled_at": g["sampled_at"].isoformat(), "utilization_gpu_pct": g["utilization_gpu_pct"],
            "utilization_memory_pct": g["utilization_memory_pct"], "memory_used_mib": g["memory_used_mib"],
            "temperature_c": g["temperature_c"], "power_w": g["power_w"],
            "ecc_volatile_sbe": g["ecc_volatile_sbe"], "ecc_volatile_dbe": g["ecc_volatile_dbe"],
            "xid_last": g["xid_last"], "process_count": g["process_count"]},
    }


def _node_view(n: asyncpg.Record, gpus: list[dict]) -> dict:
    return {
        "cluster": n["cluster"], "node": n["node"], "hostname": n["hostname"], "address": n["address"],
        "cpu_count": n["cpu_count"],
        "memory_mib": n["memory_mib"], "driver_version": n["driver_version"], "agent_version": n["agent_version"],
        "labels": json.loads(n["labels"]) if isinstance(n["labels"], str) else n["labels"], "state": n["state"],
        "registered_at": n["registered_at"].isoformat(), "last_seen_at": n["last_seen_at"].isoformat(),
        "lost_at": _iso(n["lost_at"]), "cpu_util_pct": n["cpu_util_pct"], "memory_used_mib": n["memory_used_mib"],
        "cordoned": n["cordoned"], "drained": n["drained"], "network": node_network(n), "storage": node_storage(n),
        "cordon": None if not n["cordoned"] else {"at": _iso(n["cordoned_at"]), "by": n["cordoned_by"],
                                                  "reason": n["cordon_reason"]},
        "gpus": gpus,
    }


async def list_nodes(conn: asyncpg.Connection, *, cluster: str | None, limit: int,
                     after: str | None) -> list[dict]:
    nodes = await conn.fetch(
        f"""{_NODE_VIEW} WHERE ($1::text IS NULL OR cluster = $1) AND ($2::text IS NULL OR cluster || '/' || node > $2)
           ORDER BY cluster, node LIMIT $3""", cluster, after, limit)
    if not nodes:
        return []
    gpus = await conn.fetch(
        f"""{_GPU_VIEW} WHERE (g.cluster, g.node) IN (SELECT * FROM unnest($1::text[], $2::text[]))
           ORDER BY g.cluster, g.node, g.idx""",
        [n["cluster"] for n in nodes], [n["node"] for n in nodes])
    by_node: dict[tuple[str, str], list[dict]] = {}
    for g in gpus:
        by_node.setdefault((g["cluster"], g["node"]), []).append(_gpu_view(g))
    return [_node_view(n, by_node.get((n["cluster"], n["node"]), [])) for n in nodes]


async def find_node(conn: asyncpg.Connection, cluster: str | None, node: str) -> list[asyncpg.Record]:
    """The (cluster, node) pairs a possibly cluster-less name means (several: ambiguous)."""
    return await conn.fetch("SELECT cluster, node FROM nodes WHERE node = $2 AND ($1::text IS NULL OR cluster = $1) "
                            "ORDER BY cluster LIMIT 2", cluster, node)


async def get_node(conn: asyncpg.Connection, cluster: str, node: str) -> dict | None:
    n = await conn.fetchrow(f"{_NODE_VIEW} WHERE cluster = $1 AND node = $2", cluster, node)
    if n is None:
        return None
    gpus = await conn.fetch(f"{_GPU_VIEW} WHERE g.cluster = $1 AND g.node = $2 ORDER BY g.idx", cluster, node)
    return _node_view(n, [_gpu_view(g) for g in gpus])


# --- cordon, sharing, an operator's word on health -------------------------------------------------------------
async def lock_node(conn: asyncpg.Connection, cluster: str, node: str) -> asyncpg.Record | None:
    return await conn.fetchrow("SELECT state, cordoned, drained FROM nodes WHERE cluster = $1 AND node = $2 FOR UPDATE",
                               cluster, node)


async def set_cordon(conn: asyncpg.Connection, cluster: str, node: str, *, cordoned: bool, drained: bool,
                     by: str, reason: str, at: datetime) -> None:
    await conn.execute(
        """UPDATE nodes SET cordoned = $3, drained = $4, cordoned_by = CASE WHEN $3 THEN $5 END,
                            cordon_reason = CASE WHEN $3 THEN $6 END,
                            cordoned_at = CASE WHEN $3 THEN coalesce(CASE WHEN cordoned THEN cordoned_at END, $7) END
           WHERE cluster = $1 AND node = $2""", cluster, node, cordoned, drained, by, reason, at)


async def lock_gpu(conn: asyncpg.Connection, cluster: str, node: str, index: int) -> asyncpg.Record | None:
    """One GPU for an operator's change, after its node's row lock (the order telemetry takes them in)."""
    await conn.execute("SELECT 1 FROM nodes WHERE cluster = $1 AND node = $2 FOR UPDATE", cluster, node)
    return await conn.fetchrow(
        """SELECT uuid, idx, state, state_since, state_reason, state_details, last_signal_at, strikes,
                  last_strike_at, health, sharing, sharing_target, model,
                  EXISTS (SELECT 1 FROM held_gpus h WHERE h.gpu_uuid = gpus.uuid) AS held
           FROM gpus WHERE cluster = $1 AND node = $2 AND idx = $3 FOR UPDATE""", cluster, node, index)


async def set_sharing(conn: asyncpg.Connection, uuid: str, mode: str, by: str, at: datetime) -> None:
    """The GPU's mode is now `mode` (any change waiting for it to empty is done or called off)."""
    await conn.execute("UPDATE gpus SET sharing = $2, sharing_set_by = $3, sharing_set_at = $4, "
                       "sharing_target = NULL WHERE uuid = $1", uuid, mode, by, at)


async def set_sharing_target(conn: asyncpg.Connection, uuid: str, mode: str, by: str, at: datetime) -> None:
    """The GPU becomes `mode` once the work it holds is released; until then it takes no new work."""
    await conn.execute("UPDATE gpus SET sharing_target = $2, sharing_set_by = $3, sharing_set_at = $4 WHERE uuid = $1",
                       uuid, mode, by, at)


# --- allocations, as placement announced them ------------------------------------------------------------------
async def hold(conn: asyncpg.Connection, allocation_id: str, job_id: str, team: str, cluster: str, node: str,
               gpu_uuids: list[str], granted_at: datetime) -> None:
    """Remember a live allocation and its GPUs, unless its release already arrived (events can be redelivered
    late). One statement: the GPUs' rows come from the allocation's row only if it was inserted now."""
    await conn.execute(
        """WITH a AS (
             INSERT INTO held_allocations (allocation_id, job_id, team, cluster, node, gpu_uuids, granted_at)
             SELECT $1,$2,$3,$4,$5,$6,$7
             WHERE NOT EXISTS (SELECT 1 FROM released_allocations WHERE allocation_id = $1)
             ON CONFLICT DO NOTHING RETURNING allocation_id)
           INSERT INTO held_gpus (gpu_uuid, allocation_id) SELECT u, a.allocation_id FROM a, unnest($6::text[]) u
           ON CONFLICT DO NOTHING""", allocation_id, job_id, team, cluster, node, gpu_uuids, granted_at)


async def release(conn: asyncpg.Connection, allocation_id: str, at: datetime) -> list[asyncpg.Record]:
    """Forget a released allocation (its GPUs' rows go with it), remember that it was released (a late grant is
    then not held again), resolve its orphans, and switch the allocation's GPUs that waited to change their sharing
    mode and hold nothing else now to their target, all in one statement. Every part reads the snapshot from before
    the statement, so the GPUs are those the allocation held. Returns the switched GPUs (uuid, cluster, node, idx,
    sharing, sharing_set_by)."""
    return await conn.fetch(
        """WITH forgotten AS (DELETE FROM held_allocations WHERE allocation_id = $1),
                released AS (INSERT INTO released_allocations (allocation_id, released_at) VALUES ($1, $2)
                             ON CONFLICT DO NOTHING),
                resolved AS (UPDATE orphans SET resolved_at = $2 WHERE allocation_id = $1 AND resolved_at IS NULL)
           UPDATE gpus g SET sharing = g.sharing_target, sharing_target = NULL
           FROM (SELECT unnest(gpu_uuids) AS uuid FROM held_allocations WHERE allocation_id = $1) r
           WHERE g.uuid = r.uuid AND g.sharing_target IS NOT NULL
             AND NOT EXISTS (SELECT 1 FROM held_gpus h WHERE h.gpu_uuid = g.uuid AND h.allocation_id <> $1)
           RETURNING g.uuid, g.cluster, g.node, g.idx, g.sharing, g.sharing_set_by""", allocation_id, at)


async def forget_released(conn: asyncpg.Connection, before: datetime) -> None:
    await conn.execute("DELETE FROM released_allocations WHERE released_at < $1", before)


# --- orphans ------------------------------------------------------------------------------------------------------
async def resolve_orphans(conn: asyncpg.Connection, now: datetime, fresh_since: datetime) -> int:
    """Close open orphans whose condition ended: the GPU's processes stopped or it is now held; the allocation's
    GPUs showed a process again."""
    status = await conn.execute(
        """UPDATE orphans o SET resolved_at = $1
           WHERE o.resolved_at IS NULL AND (
               (o.kind = 'process_without_allocation' AND (
                   EXISTS (SELECT 1 FROM held_gpus h WHERE h.gpu_uuid = o.gpu_uuid)
                   OR NOT EXISTS (SELECT 1 FROM gpu_telemetry_latest t WHERE t.uuid = o.gpu_uuid
                                  AND t.procs_since IS NOT NULL AND t.sampled_at >= $2)))
            OR (o.kind = 'allocation_without_process' AND EXISTS (
                   SELECT 1 FROM held_gpus h JOIN gpu_telemetry_latest t ON t.uuid = h.gpu_uuid
                   WHERE h.allocation_id = o.allocation_id AND t.last_process_at > o.since)))""", now, fresh_since)
    return int(status.split()[-1])


async def unheld_gpus_with_processes(conn: asyncpg.Connection, started_before: datetime,
                                     fresh_since: datetime) -> list[asyncpg.Record]:
    """GPUs that have run processes since before `started_before` (and still do, per a fresh sample), that no
    live allocation holds and that have no open orphan report."""
    return await conn.fetch(
        """SELECT g.uuid, g.cluster, g.node, t.procs_since, t.process_count
           FROM gpu_telemetry_latest t JOIN gpus g USING (uuid)
           WHERE t.procs_since IS NOT NULL AND t.procs_since <= $1 AND t.sampled_at >= $2
             AND NOT EXISTS (SELECT 1 FROM held_gpus h WHERE h.gpu_uuid = g.uuid)
             AND NOT EXISTS (SELECT 1 FROM orphans o WHERE o.gpu_uuid = g.uuid AND o.resolved_at IS NULL
                             AND o.kind = 'process_without_allocation')
           ORDER BY g.uuid""", started_before, fresh_since)


async def held_without_processes(conn: asyncpg.Connection, idle_before: datetime,
                                 fresh_since: datetime) -> list[asyncpg.Record]:
    """Live allocations on ready nodes, granted before `idle_before`, whose GPUs all report fresh samples and none
    of which has shown a process since `idle_before`; not yet reported."""
    return await conn.fetch(
        """SELECT h.allocation_id, h.job_id, h.team, h.cluster, h.node, h.gpu_uuids, h.granted_at,
                  max(t.last_process_at) AS last_process_at
           FROM held_allocations h JOIN nodes n USING (cluster, node)
                JOIN held_gpus hg ON hg.allocation_id = h.allocation_id
                JOIN gpu_telemetry_latest t ON t.uuid = hg.gpu_uuid
           WHERE n.state = 'ready' AND h.granted_at <= $1
             AND NOT EXISTS (SELECT 1 FROM orphans o WHERE o.allocation_id = h.allocation_id AND o.resolved_at IS NULL
                             AND o.kind = 'allocation_without_process')
           GROUP BY h.allocation_id
           HAVING count(*) = cardinality(h.gpu_uuids) AND min(t.sampled_at) >= $2
              AND coalesce(max(t.last_process_at), '-infinity') <= $1
           ORDER BY h.allocation_id""", idle_before, fresh_since)


async def record_orphan(conn: asyncpg.Connection, kind: str, cluster: str, node: str, gpu_uuid: str,
                        since: datetime, at: datetime, allocation_id: str | None = None, job_id: str | None = None,
                        team: str | None = None) -> bool:
    """One open report per GPU (or allocation); False when one is already open (a concurrent sweep won)."""
    row = await conn.fetchval(
        """INSERT INTO orphans (kind, cluster, node, gpu_uuid, allocation_id, job_id, team, since, detected_at)
           VALUES ($1,$2,$3,$4,$5,$6,$7,$8,$9) ON CONFLICT DO NOTHING RETURNING id""",
        kind, cluster, node, gpu_uuid, allocation_id, job_id, team, since, at)
    return row is not None


async def list_orphans(conn: asyncpg.Connection, *, cluster: str | None, open_only: bool, limit: int,
                       after: int | None) -> list[asyncpg.Record]:
    return await conn.fetch(
        """SELECT id, kind, cluster, node, gpu_uuid, allocation_id, job_id, team, since, detected_at, resolved_at
           FROM orphans WHERE ($1::text IS NULL OR cluster = $1) AND (NOT $2 OR resolved_at IS NULL)
             AND ($3::bigint IS NULL OR id > $3)
           ORDER BY id LIMIT $4""", cluster, open_only, after, limit)


# --- rollups ------------------------------------------------------------------------------------------------------
async def finish_open_minutes(conn: asyncpg.Connection, closed_before: datetime) -> int:
    """Move every open minute that started before `closed_before` (its GPU sent nothing later yet: silent, or a
    long interval) from the latest rows into gpu_rollups. Their nodes are locked first, as telemetry locks them
    while it merges into these rows, and only those GPUs are moved (the second statement reads after the locks)."""
    nodes = await conn.fetch(
        """SELECT n.cluster, n.node FROM nodes n
           WHERE (n.cluster, n.node) IN (SELECT g.cluster, g.node FROM gpu_telemetry_latest l JOIN gpus g USING (uuid)
                                         WHERE l.win_start < $1)
           ORDER BY n.cluster, n.node FOR UPDATE OF n""", closed_before)
    if not nodes:
        return 0
    status = await conn.execute(
        f"""WITH over AS (
               SELECT l.uuid, l.win_start, g.cluster, g.node, g.idx, l.win_samples, l.win_util_sum, l.win_util_max,
                      l.win_mem_sum, l.win_mem_max, l.win_power_sum, l.win_power_n, l.win_temp_max, l.win_procs_max
               FROM gpu_telemetry_latest l JOIN gpus g USING (uuid)
                    JOIN unnest($2::text[], $3::text[]) AS k(cluster, node) ON (g.cluster, g.node) = (k.cluster, k.node)
               WHERE l.win_start < $1),
           moved AS (
               INSERT INTO gpu_rollups AS r (uuid, window_start, cluster, node, idx, samples, util_sum, util_max,
                                             mem_sum, mem_max, power_sum, power_n, temp_max, procs_max)
               SELECT * FROM over
               {_ROLLUP_ADD})
           UPDATE gpu_telemetry_latest l SET win_start = NULL, win_samples = 0, win_util_sum = 0, win_util_max = 0,
               win_mem_sum = 0, win_mem_max = 0, win_power_sum = 0, win_power_n = 0, win_temp_max = NULL,
               win_procs_max = 0
           FROM over WHERE l.uuid = over.uuid""",
        closed_before, [n["cluster"] for n in nodes], [n["node"] for n in nodes])
    return int(status.split()[-1])


async def closed_rollups(conn: asyncpg.Connection, closed_before: datetime, limit: int) -> list[asyncpg.Record]:
    """Minutes that ended before `closed_before` and were not emitted yet, locked (skipping rows a concurrent
    closer holds), ordered so one node's minute comes together."""
    return await conn.fetch(
        """SELECT uuid, window_start, cluster, node, idx, samples, util_sum, util_max, mem_sum, mem_max, power_sum,
                  power_n, temp_max, procs_max
           FROM gpu_rollups WHERE NOT emitted AND window_start < $1
           ORDER BY window_start, cluster, node, idx LIMIT $2 FOR UPDATE SKIP LOCKED""", closed_before, limit)


async def mark_emitted(conn: asyncpg.Connection, keys: list[tuple[str, datetime]]) -> None:
    await conn.execute(
        """UPDATE gpu_rollups r SET emitted = true FROM unnest($1::text[], $2::timestamptz[]) AS k(uuid, ws)
           WHERE r.uuid = k.uuid AND r.window_start = k.ws""", [k[0] for k in keys], [k[1] for k in keys])


async def prune_rollups(conn: asyncpg.Connection, before: datetime) -> int:
    status = await conn.execute("DELETE FROM gpu_rollups WHERE emitted AND window_start < $1", before)
    return int(status.split()[-1])


# --- the pool view ------------------------------------------------------------------------------------------------
async def pool_by_model(conn: asyncpg.Connection, *, cluster: str | None, fresh_since: datetime,
                        in_use_above_pct: float) -> list[asyncpg.Record]:
    """Per (cluster, model): counts, and the uuids in use (a fresh sample above the threshold) and unhealthy (not
    placeable: GPU state not `healthy`, on a lost node, or on a cordoned node) so a caller can intersect them with
    what it knows (allocations)."""
    return await conn.fetch(
        """WITH g AS (
               SELECT g.cluster, g.model, g.uuid, g.state, n.state = 'lost' AS on_lost_node, n.cordoned,
                      g.state = 'healthy' AND n.state = 'ready' AND NOT n.cordoned AS healthy,
                      coalesce(t.sampled_at >= $2 AND t.utilization_gpu_pct > $3, false) AS in_use
               FROM gpus g JOIN nodes n USING (cluster, node) LEFT JOIN gpu_telemetry_latest t USING (uuid)
               WHERE $1::text IS NULL OR g.cluster = $1)
           SELECT cluster, model, count(*) AS total, count(*) FILTER (WHERE healthy) AS healthy,
                  count(*) FILTER (WHERE on_lost_node) AS on_lost_nodes,
                  count(*) FILTER (WHERE cordoned) AS cordoned,
                  count(*) FILTER (WHERE state = 'suspect') AS suspect,
                  count(*) FILTER (WHERE state = 'quarantined') AS quarantined,
                  count(*) FILTER (WHERE state = 'probation') AS probation,
                  coalesce(array_agg(uuid ORDER BY uuid) FILTER (WHERE in_use), '{}') AS in_use_gpus,
                  coalesce(array_agg(uuid ORDER BY uuid) FILTER (WHERE NOT healthy), '{}') AS unhealthy_gpus
           FROM g GROUP BY cluster, model ORDER BY cluster, model""", cluster, fresh_since, in_use_above_pct)


async def pool_nodes(conn: asyncpg.Connection, *, cluster: str | None) -> list[asyncpg.Record]:
    return await conn.fetch(
        """SELECT n.cluster, n.node, n.hostname, n.state, n.last_seen_at, n.cpu_count, n.cpu_util_pct,
                  n.memory_mib, n.memory_used_mib, n.cordoned, n.network, n.storage, n.network_rx_mbps,
                  n.network_tx_mbps, n.storage_used_gib, count(g.uuid) AS gpus,
                  count(g.uuid) FILTER (WHERE g.state = 'healthy') AS healthy,
                  count(g.uuid) FILTER (WHERE g.state = 'suspect') AS suspect,
                  count(g.uuid) FILTER (WHERE g.state = 'quarantined') AS quarantined,
                  count(g.uuid) FILTER (WHERE g.state = 'probation') AS probation,
                  count(g.uuid) FILTER (WHERE g.sharing = 'exclusive') AS exclusive,
                  count(g.uuid) FILTER (WHERE g.sharing = 'fractional') AS fractional,
                  count(g.uuid) FILTER (WHERE g.sharing = 'mig') AS mig,
                  count(g.uuid) FILTER (WHERE g.sharing_target IS NOT NULL) AS draining
           FROM nodes n LEFT JOIN gpus g USING (cluster, node)
           WHERE $1::text IS NULL OR n.cluster = $1
           GROUP BY n.cluster, n.node ORDER BY n.cluster, n.node""", cluster)


async def held_by_model(conn: asyncpg.Connection, *, fresh_since: datetime,
                        in_use_above_pct: float) -> list[asyncpg.Record]:
    """Per (cluster, model): GPUs held by live allocations, and how many of them are idle (no sample since
    `fresh_since` above the in-use threshold). A GPU shared by several allocations counts once."""
    return await conn.fetch(
        """SELECT g.cluster, g.model, count(DISTINCT g.uuid) AS held,
                  count(DISTINCT g.uuid) FILTER (WHERE NOT coalesce(t.sampled_at >= $1
                                                                    AND t.utilization_gpu_pct > $2, false)) AS idle
           FROM held_gpus h JOIN gpus g ON g.uuid = h.gpu_uuid LEFT JOIN gpu_telemetry_latest t ON t.uuid = g.uuid
           GROUP BY g.cluster, g.model ORDER BY g.cluster, g.model""", fresh_since, in_use_above_pct)
