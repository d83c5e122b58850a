"""Every SQL statement of the accounting service."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from datetime import datetime
from decimal import Decimal
from typing import Any

import asyncpg

from libs.contracts.events import AllocationEvent, AllocationReleased, GpuRollup, JobSubmitted, NodeRegistered
from services.accounting.domain import sharing_of

# Report dimension → gpu_intervals column (a whitelist: only these names ever reach SQL text).
COLUMNS: dict[str, str] = {"team": "team", "project": "project", "user": "user_name", "kind": "kind",
                           "gpu_model": "gpu_model", "sharing": "sharing", "mig_profile": "mig_profile"}


# --- jobs and queue waits ------------------------------------------------------------------------------------------
async def job_submitted(conn: asyncpg.Connection, data: JobSubmitted, user: str, *, entered_at: datetime,
                        demand_milli: int, gpu_model: str) -> None:
    """The job's submitter and what it asks for (a later submission, e.g. after a scale, updates the request), and
    a wait starting at `entered_at` unless the job is already waiting (a repeated submission event changes
    nothing): one statement, two tables."""
    await conn.execute(
        """WITH j AS (
             INSERT INTO jobs (job_id, team, project, user_name, kind, submitted_at, name, priority, priority_class,
                               gpus, gpu_models, gpu_fraction_milli, mig_profile, gang_nodes, gpus_per_node,
                               replicas, max_runtime_s)
             VALUES ($1,$2,$3,$4,$5,$6,$7,$8,$9,$10,$11,$12,$13,$14,$15,$16,$17)
             ON CONFLICT (job_id) DO UPDATE SET user_name = CASE WHEN EXCLUDED.user_name = 'unknown'
                                                                 THEN jobs.user_name ELSE EXCLUDED.user_name END,
                 name = EXCLUDED.name, priority = EXCLUDED.priority, priority_class = EXCLUDED.priority_class,
                 gpus = EXCLUDED.gpus, gpu_models = EXCLUDED.gpu_models,
                 gpu_fraction_milli = EXCLUDED.gpu_fraction_milli, mig_profile = EXCLUDED.mig_profile,
                 gang_nodes = EXCLUDED.gang_nodes, gpus_per_node = EXCLUDED.gpus_per_node,
                 replicas = EXCLUDED.replicas, max_runtime_s = EXCLUDED.max_runtime_s)
           INSERT INTO queue_waits (job_id, entered_at, team, demand_milli, gpu_model)
           SELECT $1::text, $18::timestamptz, $2::text, $19::bigint, $20::text
           WHERE NOT EXISTS (SELECT 1 FROM queue_waits WHERE job_id = $1::text AND ended_at IS NULL)
           ON CONFLICT DO NOTHING""",
        data.job_id, data.team, data.project, user, data.kind, data.submitted_at, data.name, data.priority,
        data.priority_class, data.gpus, list(data.gpu_models), data.gpu_fraction_milli, data.mig_profile,
        data.gang_nodes, data.gpus_per_node, data.replicas, data.max_runtime_s, entered_at, demand_milli, gpu_model)


async def job_kind(conn: asyncpg.Connection, job_id: str) -> str:
    return await conn.fetchval("SELECT kind FROM jobs WHERE job_id = $1", job_id) or "unknown"


async def interval_kind(conn: asyncpg.Connection, allocation_id: str) -> str | None:
    """The job kind recorded when the allocation was granted; None if accounting never saw the grant."""
    return await conn.fetchval("SELECT kind FROM gpu_intervals WHERE allocation_id = $1 LIMIT 1", allocation_id)


async def close_wait(conn: asyncpg.Connection, job_id: str, at: datetime, outcome: str,
                     gpu_model: str | None = None) -> None:
    await conn.execute(
        """UPDATE queue_waits SET ended_at = GREATEST($2, entered_at), outcome = $3,
                                  gpu_model = COALESCE($4, gpu_model)
           WHERE job_id = $1 AND ended_at IS NULL""", job_id, at, outcome, gpu_model)


# --- the ledger --------------------------------------------------------------------------------------------------
def node_lock_key(cluster: str, node: str) -> int:
    """The advisory lock key of one node's GPUs (64-bit, from a hash of cluster and node)."""
    return int.from_bytes(hashlib.blake2b(f"gpu-node:{cluster}/{node}".encode(), digest_size=8).digest(), "big",
                          signed=True)


async def lock_node(conn: asyncpg.Connection, cluster: str, node: str) -> None:
    """For a rollup: its node's lock, exclusively. A rollup and the allocation events of its node must not
    interleave: both change the utilization accumulators of the node's intervals, each side from what the other
    stored. The rollup takes this one lock, first: it never holds a lock while it waits, so it can never close a
    cycle with a batch of allocation events, whatever nodes the batch holds in whatever order. Allocation events
    take it shared (lock_allocation): each writes only its own allocation's rows, so they need not exclude each
    other, and two replicas' batches never wait on each other for it (README: "Batched event handling")."""
    await conn.execute("SELECT pg_advisory_xact_lock($1)", node_lock_key(cluster, node))


def allocation_lock_key(allocation_id: str) -> int:
    return int.from_bytes(hashlib.blake2b(f"allocation:{allocation_id}".encode(), digest_size=8).digest(), "big",
                          signed=True)


async def lock_allocation(conn: asyncpg.Connection, data: AllocationEvent) -> asyncpg.Record:
    """For an allocation event: the node's lock shared (see lock_node) and, without waiting, the allocation's own
    lock; `locked` False: another transaction holds the allocation (another replica's batch is applying its grant
    or its release): waiting for it could close a cycle with that batch (each holding one allocation's new rows and
    wanting the other's), so the caller retries instead. Within one batch the lock is its own, so never False.

    In the same round trip, what the handlers read next: the job's `user_name` ("unknown" if accounting never saw
    it submitted), its `job_kind` (likewise), and the `interval_kind` recorded at the grant (None: no interval rows
    in the statement's snapshot, taken before the node's lock was granted; a grant committed meanwhile is found by
    insert_intervals, which then inserts nothing)."""
    return await conn.fetchrow(
        """SELECT pg_try_advisory_xact_lock($2) AS locked,
                  coalesce((SELECT user_name FROM jobs WHERE job_id = $3), 'unknown') AS user_name,
                  coalesce((SELECT kind FROM jobs WHERE job_id = $3), 'unknown') AS job_kind,
                  (SELECT kind FROM gpu_intervals WHERE allocation_id = $4 LIMIT 1) AS interval_kind
           FROM (SELECT pg_advisory_xact_lock_shared($1)) AS node""",
        node_lock_key(data.cluster, data.node), allocation_lock_key(data.allocation_id), data.job_id,
        data.allocation_id)


async def insert_intervals(conn: asyncpg.Connection, data: AllocationEvent, *, user: str, kind: str,
                           granted_at: datetime, released_at: datetime | None, reason: str | None,
                           idle_util_pct: float, wait_granted: str | None = None) -> bool:
    """The allocation's per-GPU rows, with utilization from rollups already stored. False: they existed.
    `wait_granted` (the GPU model): the same statement also ends the job's queue wait at `granted_at` with
    outcome "granted" (close_wait), whether or not the rows existed."""
    rows = [(data.allocation_id, slot, g.uuid, g.index, data.job_id, data.team, data.project, user, kind,
             data.cluster, data.node, g.model, g.share_milli, g.mig_profile or "", sharing_of(g), granted_at,
             released_at, reason) for slot, g in enumerate(data.gpus)]
    if not rows:
        if wait_granted is not None:
            await close_wait(conn, data.job_id, granted_at, "granted", wait_granted)
        return False
    wait = ""
    if wait_granted is not None:
        wait = """w AS (UPDATE queue_waits SET ended_at = GREATEST($16::timestamptz, entered_at), outcome = 'granted',
                                        gpu_model = COALESCE($20::text, gpu_model)
                    WHERE job_id = $5::text AND ended_at IS NULL),
               """
    # one statement: nothing is written if the allocation's rows exist already (a redelivered grant); each row's
    # utilization from the rollups already stored for its GPU over the interval (covered µs, × utilization, idle)
    inserted = await conn.fetchval(
        f"""WITH {wait}ins AS (
             INSERT INTO gpu_intervals (allocation_id, slot, gpu_uuid, gpu_index, job_id, team, project, user_name,
                                        kind, cluster, node, gpu_model, share_milli, mig_profile, sharing,
                                        granted_at, released_at, release_reason, covered_us, util_us, idle_us)
             SELECT $1::text, s.slot, s.uuid, s.idx, $5::text, $6::text, $7::text, $8::text, $9::text, $10::text,
                    $11::text, s.model, s.share, s.mig, s.sharing, $16::timestamptz, $17::timestamptz, $18::text,
                    coalesce(u.cov, 0), coalesce(u.util, 0), coalesce(u.idle, 0)
             FROM unnest($2::int[], $3::text[], $4::int[], $12::text[], $13::int[], $14::text[], $15::text[])
                  AS s(slot, uuid, idx, model, share, mig, sharing)
             LEFT JOIN LATERAL (
                  SELECT SUM(x.ov) AS cov, SUM(x.ov * r.util_avg_pct) AS util,
                         SUM(CASE WHEN r.util_avg_pct <= $19 THEN x.ov ELSE 0 END) AS idle
                  FROM gpu_rollups r
                  CROSS JOIN LATERAL (SELECT acct_us(GREATEST($16::timestamptz, r.window_start),
                                                     LEAST(COALESCE($17::timestamptz, r.window_end), r.window_end))
                                             ::double precision AS ov) x
                  WHERE r.gpu_uuid = s.uuid AND r.window_end > $16::timestamptz
                    AND ($17::timestamptz IS NULL OR r.window_start < $17::timestamptz)) u ON true
             WHERE NOT EXISTS (SELECT 1 FROM gpu_intervals WHERE allocation_id = $1::text)
             ON CONFLICT DO NOTHING  -- rows another transaction is inserting: wait for it, then leave them
             RETURNING 1)
           SELECT count(*) FROM ins""",
        data.allocation_id, [r[1] for r in rows], [r[2] for r in rows], [r[3] for r in rows], data.job_id,
        data.team, data.project, user, kind, data.cluster, data.node, [r[11] for r in rows],
        [r[12] for r in rows], [r[13] for r in rows], [r[14] for r in rows], granted_at, released_at, reason,
        idle_util_pct, *([wait_granted] if wait_granted is not None else []))
    return bool(inserted)


async def close_intervals(conn: asyncpg.Connection, allocation_id: str, released_at: datetime, reason: str,
                          idle_util_pct: float) -> int:
    """Mark the allocation's open GPU rows released. Rollups stored while they were open were counted up to their
    window's end; take back the part after the release, in the same statement. Returns how many rows were
    closed."""
    slots = await conn.fetch(
        """UPDATE gpu_intervals g SET released_at = GREATEST($2, g.granted_at), release_reason = $3,
                  (covered_us, util_us, idle_us) = (
                      SELECT GREATEST(0, g.covered_us - coalesce(SUM(x.ov), 0)),
                             GREATEST(0, g.util_us - coalesce(SUM(x.ov * r.util_avg_pct), 0)),
                             GREATEST(0, g.idle_us - coalesce(SUM(CASE WHEN r.util_avg_pct <= $4 THEN x.ov ELSE 0 END),
                                                              0))
                      FROM gpu_rollups r
                      CROSS JOIN LATERAL (SELECT acct_us(GREATEST(r.window_start, g.granted_at,
                                                                  GREATEST($2, g.granted_at)),
                                                         r.window_end)::double precision AS ov) x
                      WHERE r.gpu_uuid = g.gpu_uuid AND r.window_end > GREATEST($2, g.granted_at)
                        AND r.window_end > g.granted_at)
           WHERE g.allocation_id = $1 AND g.released_at IS NULL RETURNING g.slot""",
        allocation_id, released_at, reason, idle_util_pct)
    return len(slots)


async def record_usage(conn: asyncpg.Connection, data: AllocationReleased, *, model: str, user: str, kind: str,
                       share_milli: int, milli_us: int) -> bool:
    inserted = await conn.fetchval(
        """INSERT INTO usage_ledger (allocation_id, job_id, team, project, gpu_model, gpu_count, gpu_seconds,
                                     started_at, ended_at, release_reason, user_name, kind, share_milli, gpu_milli_us)
           VALUES ($1,$2,$3,$4,$5,$6,$7,$8,$9,$10,$11,$12,$13,$14)
           ON CONFLICT (allocation_id) DO NOTHING RETURNING 1""",
        data.allocation_id, data.job_id, data.team, data.project, model, len(data.gpus),
        milli_us / 1e9, data.granted_at, data.released_at, data.reason, user, kind, share_milli, milli_us)
    return inserted is not None


async def list_usage(conn: asyncpg.Connection, *, team: str | None, job_id: str | None, limit: int,
                     after: str | None) -> list[asyncpg.Record]:
    return await conn.fetch(
        """SELECT allocation_id, job_id, team, project, gpu_model, gpu_count, gpu_seconds, started_at, ended_at,
                  release_reason, user_name AS "user", kind, share_milli / 1000.0 AS gpu_share
           FROM usage_ledger
           WHERE ($1::text IS NULL OR team = $1) AND ($2::text IS NULL OR job_id = $2)
             AND ($3::text IS NULL OR allocation_id > $3)
           ORDER BY allocation_id LIMIT $4""", team, job_id, after, limit)


# --- rollups ------------------------------------------------------------------------------------------------------
async def apply_rollup(conn: asyncpg.Connection, *, cluster: str, node: str, window_start: datetime,
                       window_end: datetime, gpu: GpuRollup, idle_util_pct: float) -> bool:
    """Store one GPU's rollup once and add it to the intervals holding that GPU on that node during the window
    (only that node's rows: the node's lock covers exactly them). A rollup seen again (redelivery) changes
    nothing."""
    inserted = await conn.fetchval(
        """INSERT INTO gpu_rollups (gpu_uuid, window_start, window_end, cluster, node, samples, util_avg_pct,
                                    mem_avg_mib)
           VALUES ($1,$2,$3,$4,$5,$6,$7,$8) ON CONFLICT DO NOTHING RETURNING 1""",
        gpu.uuid, window_start, window_end, cluster, node, gpu.samples, gpu.utilization_avg_pct,
        gpu.memory_used_avg_mib)
    if inserted is None:
        return False
    await conn.execute(
        """UPDATE gpu_intervals g SET covered_us = g.covered_us + x.ov, util_us = g.util_us + x.ov * $4,
                                      idle_us = g.idle_us + CASE WHEN $4 <= $5 THEN x.ov ELSE 0 END
           FROM (SELECT allocation_id, slot,
                        acct_us(GREATEST(granted_at, $2), LEAST(COALESCE(released_at, $3), $3))::double precision AS ov
                 FROM gpu_intervals
                 WHERE gpu_uuid = $1 AND granted_at < $3 AND (released_at IS NULL OR released_at > $2)
                   AND cluster = $6 AND node = $7) x
           WHERE g.allocation_id = x.allocation_id AND g.slot = x.slot AND x.ov > 0""",
        gpu.uuid, window_start, window_end, gpu.utilization_avg_pct, idle_util_pct, cluster, node)
    return True


async def prune_rollups(conn: asyncpg.Connection, before: datetime) -> int:
    status = await conn.execute("DELETE FROM gpu_rollups WHERE window_end < $1", before)
    return int(status.split()[-1])


# --- supply -----------------------------------------------------------------------------------------------------
async def register_node(conn: asyncpg.Connection, data: NodeRegistered) -> None:
    await conn.execute(
        """INSERT INTO supply_nodes (cluster, node, lost) VALUES ($1, $2, FALSE)
           ON CONFLICT (cluster, node) DO UPDATE SET lost = FALSE""", data.cluster, data.node)
    await conn.execute("DELETE FROM supply_gpus WHERE cluster = $1 AND node = $2", data.cluster, data.node)
    await conn.executemany(
        """INSERT INTO supply_gpus (gpu_uuid, cluster, node, gpu_model, health) VALUES ($1,$2,$3,$4,$5)
           ON CONFLICT (gpu_uuid) DO UPDATE SET cluster = EXCLUDED.cluster, node = EXCLUDED.node,
                                                gpu_model = EXCLUDED.gpu_model, health = EXCLUDED.health""",
        [(g.uuid, data.cluster, data.node, g.model, g.health) for g in data.gpus])


async def set_node_lost(conn: asyncpg.Connection, cluster: str, node: str, lost: bool) -> None:
    await conn.execute(
        """INSERT INTO supply_nodes (cluster, node, lost) VALUES ($1, $2, $3)
           ON CONFLICT (cluster, node) DO UPDATE SET lost = EXCLUDED.lost""", cluster, node, lost)


async def set_gpu_health(conn: asyncpg.Connection, gpu_uuid: str, health: str) -> None:
    await conn.execute("UPDATE supply_gpus SET health = $2 WHERE gpu_uuid = $1", gpu_uuid, health)


SUPPLY_NOW = """SELECT g.gpu_model, count(*)::int AS gpus FROM supply_gpus g
                JOIN supply_nodes n ON n.cluster = g.cluster AND n.node = g.node
                WHERE NOT n.lost AND g.health <> 'failed' GROUP BY g.gpu_model"""


async def supply_now(conn: asyncpg.Connection) -> dict[str, int]:
    return {r["gpu_model"]: r["gpus"] for r in await conn.fetch(SUPPLY_NOW)}


async def note_supply(conn: asyncpg.Connection, at: datetime) -> None:
    """Append a supply change for every model whose count differs from its last recorded one."""
    await conn.execute(
        f"""WITH now AS ({SUPPLY_NOW}),
                 last AS (SELECT DISTINCT ON (gpu_model) gpu_model, gpus FROM supply_changes
                          ORDER BY gpu_model, at DESC, id DESC),
                 merged AS (SELECT COALESCE(n.gpu_model, l.gpu_model) AS gpu_model, COALESCE(n.gpus, 0) AS gpus,
                                   l.gpus AS before
                            FROM now n FULL JOIN last l ON l.gpu_model = n.gpu_model)
            INSERT INTO supply_changes (at, gpu_model, gpus)
            SELECT $1, gpu_model, gpus FROM merged WHERE before IS DISTINCT FROM gpus""", at)


async def supply_history(conn: asyncpg.Connection, end: datetime) -> list[asyncpg.Record]:
    return await conn.fetch("SELECT at, gpu_model, gpus FROM supply_changes WHERE at < $1 ORDER BY at, id", end)


# --- cost rates -------------------------------------------------------------------------------------------------
async def list_rates(conn: asyncpg.Connection, gpu_model: str | None = None) -> list[asyncpg.Record]:
    return await conn.fetch(
        """SELECT gpu_model, mig_profile, effective_from, price_per_hour, set_by, set_at FROM cost_rates
           WHERE ($1::text IS NULL OR gpu_model = $1) ORDER BY gpu_model, mig_profile, effective_from""", gpu_model)


async def get_rate(conn: asyncpg.Connection, gpu_model: str, mig_profile: str,
                   effective_from: datetime) -> asyncpg.Record | None:
    return await conn.fetchrow(
        """SELECT gpu_model, mig_profile, effective_from, price_per_hour, set_by, set_at FROM cost_rates
           WHERE gpu_model = $1 AND mig_profile = $2 AND effective_from = $3 FOR UPDATE""",
        gpu_model, mig_profile, effective_from)


async def put_rate(conn: asyncpg.Connection, gpu_model: str, mig_profile: str, effective_from: datetime,
                   price: Decimal, set_by: str, set_at: datetime) -> asyncpg.Record:
    return await conn.fetchrow(
        """INSERT INTO cost_rates (gpu_model, mig_profile, effective_from, price_per_hour, set_by, set_at)
           VALUES ($1,$2,$3,$4,$5,$6)
           ON CONFLICT (gpu_model, mig_profile, effective_from)
           DO UPDATE SET price_per_hour = EXCLUDED.price_per_hour, set_by = EXCLUDED.set_by, set_at = EXCLUDED.set_at
           RETURNING gpu_model, mig_profile, effective_from, price_per_hour, set_by, set_at""",
        gpu_model, mig_profile, effective_from, price, set_by, set_at)


async def delete_rate(conn: asyncpg.Connection, gpu_model: str, mig_profile: str, effective_from: datetime) -> None:
    await conn.execute("DELETE FROM cost_rates WHERE gpu_model = $1 AND mig_profile = $2 AND effective_from = $3",
                       gpu_model, mig_profile, effective_from)


# --- orphans --------------------------------------------------------------------------------------------------------
async def note_orphan(conn: asyncpg.Connection, *, gpu_uuid: str, orphan: str, allocation_id: str | None,
                      job_id: str | None, team: str | None, cluster: str, node: str, pids: list[int],
                      since: datetime, detected_at: datetime) -> None:
    await conn.execute(
        """INSERT INTO orphans (gpu_uuid, orphan, allocation_id, job_id, team, cluster, node, pids, since,
                                first_detected_at, last_detected_at)
           VALUES ($1,$2,$3,$4,$5,$6,$7,$8,$9,$10,$10)
           ON CONFLICT (gpu_uuid, orphan, allocation_id) DO UPDATE SET
               pids = EXCLUDED.pids, since = LEAST(orphans.since, EXCLUDED.since),
               first_detected_at = LEAST(orphans.first_detected_at, EXCLUDED.first_detected_at),
               last_detected_at = GREATEST(orphans.last_detected_at, EXCLUDED.last_detected_at),
               reports = orphans.reports + 1,
               job_id = COALESCE(EXCLUDED.job_id, orphans.job_id), team = COALESCE(EXCLUDED.team, orphans.team)""",
        gpu_uuid, orphan, allocation_id or "", job_id, team, cluster, node, pids, since, detected_at)


async def orphans_between(conn: asyncpg.Connection, start: datetime, end: datetime, teams: Sequence[str] | None,
                          limit: int) -> list[asyncpg.Record]:
    return await conn.fetch(
        """SELECT gpu_uuid, orphan, NULLIF(allocation_id, '') AS allocation_id, job_id, team, cluster, node, pids,
                  since, first_detected_at, last_detected_at, reports
           FROM orphans WHERE last_detected_at >= $1 AND first_detected_at < $2
             AND ($3::text[] IS NULL OR team = ANY($3))
           ORDER BY last_detected_at DESC LIMIT $4""", start, end, list(teams) if teams is not None else None, limit)


# --- reports ------------------------------------------------------------------------------------------------------
def _filters(filters: dict[str, list[str]], args: list[Any], alias: str = "g") -> str:
    sql = []
    for dim, values in sorted(filters.items()):
        args.append(list(values))
        sql.append(f" AND {alias}.{COLUMNS[dim]} = ANY(${len(args)}::text[])")
    return "".join(sql)


def _group_cols(group_by: Sequence[str], alias: str = "g") -> str:
    return "".join(f'{alias}.{COLUMNS[d]} AS "{d}", ' for d in group_by)


async def usage_pieces(conn: asyncpg.Connection, *, bounds: Sequence[tuple[datetime, datetime]], as_of: datetime,
                       group_by: Sequence[str], filters: dict[str, list[str]]) -> list[asyncpg.Record]:
    """GPU time per group × model × MIG profile × price segment: instance-µs, milli-GPU-µs (exact), and the
    utilization-weighted parts (each interval's own average applied to the piece inside the range)."""
    args: list[Any] = [[s for s, _ in bounds], [e for _, e in bounds], as_of]
    where = _filters(filters, args)
    groups = _group_cols(group_by)
    keys = ", ".join(str(i + 1) for i in range(len(group_by) + 3))
    return await conn.fetch(
        f"""WITH seg AS (SELECT s, e, (i - 1)::int AS i
                         FROM unnest($1::timestamptz[], $2::timestamptz[]) WITH ORDINALITY AS t(s, e, i)),
                 p AS (SELECT {groups} g.gpu_model AS _model, g.mig_profile AS _profile, seg.i AS _seg,
                              g.share_milli, g.covered_us, g.util_us, g.idle_us,
                              acct_us(GREATEST(g.granted_at, seg.s), LEAST(COALESCE(g.released_at, $3), seg.e)) AS us
                       FROM gpu_intervals g
                       JOIN seg ON g.granted_at < seg.e AND COALESCE(g.released_at, $3) > seg.s
                       WHERE g.granted_at < $3{where})
            SELECT {", ".join(f'"{d}"' for d in group_by)}{", " if group_by else ""}_model, _profile, _seg,
                   SUM(us)::bigint AS inst_us, SUM(us * share_milli) AS milli_us,
                   COALESCE(SUM(us * share_milli) FILTER (WHERE covered_us > 0), 0) AS measured_milli_us,
                   COALESCE(SUM(us * share_milli * util_us / covered_us / 100) FILTER (WHERE covered_us > 0), 0)
                       AS used_milli_us,
                   COALESCE(SUM(us * share_milli * idle_us / covered_us) FILTER (WHERE covered_us > 0), 0)
                       AS idle_milli_us
            FROM p GROUP BY {keys}""", *args)


async def allocation_counts(conn: asyncpg.Connection, *, start: datetime, as_of: datetime, group_by: Sequence[str],
                            filters: dict[str, list[str]]) -> list[asyncpg.Record]:
    args: list[Any] = [start, as_of]
    where = _filters(filters, args)
    groups = ", ".join(f'g.{COLUMNS[d]} AS "{d}"' for d in group_by)
    keys = ", ".join(str(i + 1) for i in range(len(group_by)))
    return await conn.fetch(
        f"""SELECT {groups}{", " if group_by else ""}count(DISTINCT g.allocation_id)::int AS allocations,
                   count(DISTINCT g.job_id)::int AS jobs
            FROM gpu_intervals g
            WHERE g.granted_at < $2 AND COALESCE(g.released_at, $2) > $1{where}
            {"GROUP BY " + keys if group_by else ""}""", *args)


async def idle_allocations(conn: asyncpg.Connection, *, start: datetime, as_of: datetime,
                           filters: dict[str, list[str]], min_idle_fraction: float,
                           limit: int) -> list[asyncpg.Record]:
    args: list[Any] = [start, as_of, min_idle_fraction, limit]
    where = _filters(filters, args)
    return await conn.fetch(
        f"""WITH p AS (SELECT g.*, acct_us(GREATEST(g.granted_at, $1), LEAST(COALESCE(g.released_at, $2), $2)) AS us
                       FROM gpu_intervals g
                       WHERE g.granted_at < $2 AND COALESCE(g.released_at, $2) > $1{where})
            SELECT allocation_id, min(job_id) AS job_id, min(team) AS team, min(project) AS project,
                   min(user_name) AS "user", min(kind) AS kind, min(cluster) AS cluster, min(node) AS node,
                   min(gpu_model) AS gpu_model, count(*)::int AS gpus, SUM(share_milli)::int AS share_milli,
                   min(granted_at) AS granted_at, max(released_at) AS released_at,
                   bool_or(released_at IS NULL) AS running, max(release_reason) AS release_reason,
                   SUM(us * share_milli) AS milli_us,
                   COALESCE(SUM(us * share_milli) FILTER (WHERE covered_us > 0), 0) AS measured_milli_us,
                   COALESCE(SUM(us * share_milli * idle_us / covered_us) FILTER (WHERE covered_us > 0), 0)
                       AS idle_milli_us,
                   SUM(util_us) / NULLIF(SUM(covered_us), 0) AS avg_utilization_pct
            FROM p GROUP BY allocation_id
            HAVING SUM(covered_us) > 0
               AND COALESCE(SUM(us * share_milli * idle_us / covered_us) FILTER (WHERE covered_us > 0), 0)
                   >= $3 * SUM(us * share_milli) FILTER (WHERE covered_us > 0)
               AND COALESCE(SUM(us * share_milli * idle_us / covered_us) FILTER (WHERE covered_us > 0), 0) > 0
            ORDER BY idle_milli_us DESC, allocation_id LIMIT $4""", *args)


async def demand_levels(conn: asyncpg.Connection, *, start: datetime, end: datetime, as_of: datetime,
                        bucket_s: int, n_buckets: int, team: str | None,
                        gpu_model: str | None) -> list[asyncpg.Record]:
    """Per model, source (`held`: allocated GPUs; `demand`: allocated + waiting) and trend bucket: the running level
    of GPUs (milli) — its highest value after an event in the bucket, its value after the bucket's last event, and
    the first event's time. The level at an instant counts every event at that instant (intervals are half-open, so
    a release and a grant at the same instant never overlap)."""
    return await conn.fetch(
        """WITH held AS (SELECT gpu_model AS model, GREATEST(granted_at, $1) AS t0,
                                LEAST(COALESCE(released_at, $3), $2) AS t1, share_milli::bigint AS d
                         FROM gpu_intervals
                         WHERE granted_at < LEAST($2, $3) AND COALESCE(released_at, $3) > $1
                           AND ($6::text IS NULL OR team = $6) AND ($7::text IS NULL OR gpu_model = $7)),
                 waits AS (SELECT gpu_model AS model, GREATEST(entered_at, $1) AS t0,
                                  LEAST(COALESCE(ended_at, $3), $2) AS t1, demand_milli AS d
                           FROM queue_waits
                           WHERE entered_at < LEAST($2, $3) AND COALESCE(ended_at, $3) > $1
                             AND ($6::text IS NULL OR team = $6) AND ($7::text IS NULL OR gpu_model = $7)),
                 spans AS (SELECT 'held' AS src, * FROM held
                           UNION ALL SELECT 'demand', * FROM held
                           UNION ALL SELECT 'demand', * FROM waits),
                 ev AS (SELECT src, model, t0 AS t, d FROM spans WHERE t1 > t0
                        UNION ALL SELECT src, model, t1, -d FROM spans WHERE t1 > t0),
                 lv AS (SELECT src, model, t, d,
                               SUM(d) OVER (PARTITION BY src, model ORDER BY t RANGE UNBOUNDED PRECEDING) AS lvl
                        FROM ev)
            SELECT src, model,
                   LEAST(FLOOR(EXTRACT(EPOCH FROM t - $1) / $4)::int, $5 - 1) AS bucket,
                   MAX(lvl)::bigint AS max_level,
                   ((array_agg(lvl ORDER BY t DESC))[1])::bigint AS last_level,
                   MIN(t) AS first_t
            FROM lv GROUP BY 1, 2, 3""",
        start, end, as_of, bucket_s, n_buckets, team, gpu_model)


async def wait_stats(conn: asyncpg.Connection, *, start: datetime, end: datetime, as_of: datetime,
                     team: str | None, gpu_model: str | None) -> list[asyncpg.Record]:
    return await conn.fetch(
        """SELECT gpu_model,
                  count(*) FILTER (WHERE outcome = 'granted' AND ended_at >= $1 AND ended_at < $2)::int AS granted,
                  percentile_cont(ARRAY[0.5, 0.9, 0.99]) WITHIN GROUP (ORDER BY EXTRACT(EPOCH FROM ended_at - entered_at))
                      FILTER (WHERE outcome = 'granted' AND ended_at >= $1 AND ended_at < $2) AS wait_pcts,
                  MAX(EXTRACT(EPOCH FROM ended_at - entered_at))
                      FILTER (WHERE outcome = 'granted' AND ended_at >= $1 AND ended_at < $2) AS wait_max,
                  COALESCE(SUM(acct_us(GREATEST(entered_at, $1), LEAST(COALESCE(ended_at, $3), $2)) * demand_milli)
                      FILTER (WHERE entered_at < LEAST($2, $3) AND COALESCE(ended_at, $3) > $1), 0) AS queued_milli_us,
                  COALESCE(SUM(demand_milli) FILTER (WHERE entered_at <= $3 AND (ended_at IS NULL OR ended_at > $3)), 0)
                      AS pending_milli
           FROM queue_waits
           WHERE ($4::text IS NULL OR team = $4) AND ($5::text IS NULL OR gpu_model = $5)
             AND (ended_at IS NULL OR ended_at >= $1) AND entered_at < $2
           GROUP BY gpu_model""", start, end, as_of, team, gpu_model)


async def held_by_model(conn: asyncpg.Connection, *, start: datetime, as_of: datetime, team: str | None,
                        gpu_model: str | None) -> dict[str, int]:
    rows = await conn.fetch(
        """SELECT gpu_model, SUM(acct_us(GREATEST(granted_at, $1), LEAST(COALESCE(released_at, $2), $2))
                                 * share_milli) AS milli_us
           FROM gpu_intervals
           WHERE granted_at < $2 AND COALESCE(released_at, $2) > $1
             AND ($3::text IS NULL OR team = $3) AND ($4::text IS NULL OR gpu_model = $4)
           GROUP BY gpu_model""", start, as_of, team, gpu_model)
    return {r["gpu_model"]: int(r["milli_us"]) for r in rows}


# --- history export ------------------------------------------------------------------------------------------------
async def history_jobs(conn: asyncpg.Connection, *, start: datetime, end: datetime, as_of: datetime,
                       teams: Sequence[str] | None, after: str | None, limit: int) -> list[asyncpg.Record]:
    """Jobs that entered the queue in [start, end), in job id order after `after`: what they asked for, when they
    first entered the queue, their first grant, and their last run (the allocations granted at the last grant
    instant: a gang's members or a job's replicas together) — its start, its end (`as_of` while it runs), GPUs held
    by share, model, MIG profile and nodes. A job never granted has NULL grant columns."""
    return await conn.fetch(
        """WITH j AS (SELECT j.*, w.entered_at, w.waiting, w.cancelled
                      FROM jobs j
                      JOIN LATERAL (SELECT min(entered_at) AS entered_at, bool_or(ended_at IS NULL) AS waiting,
                                           bool_or(outcome = 'cancelled') AS cancelled
                                    FROM queue_waits WHERE job_id = j.job_id) w ON TRUE
                      WHERE w.entered_at >= $1 AND w.entered_at < $2
                        AND ($4::text[] IS NULL OR j.team = ANY($4)) AND ($5::text IS NULL OR j.job_id > $5)
                      ORDER BY j.job_id LIMIT $6)
           SELECT j.job_id, j.team, j.project, j.user_name, j.kind, j.name, j.priority, j.priority_class, j.gpus,
                  j.gpu_models, j.gpu_fraction_milli, j.mig_profile, j.gang_nodes, j.gpus_per_node, j.replicas,
                  j.max_runtime_s, j.entered_at, j.waiting, j.cancelled,
                  r.first_granted, r.last_granted, r.ended, r.running, r.slots, r.share_milli, r.gpu_model,
                  r.mig_profile AS held_mig_profile, r.nodes, r.allocations
           FROM j LEFT JOIN LATERAL (
               SELECT (SELECT min(granted_at) FROM gpu_intervals WHERE job_id = j.job_id) AS first_granted,
                      min(i.granted_at) AS last_granted,
                      max(COALESCE(i.released_at, $3)) AS ended, bool_or(i.released_at IS NULL) AS running,
                      count(*)::int AS slots, SUM(i.share_milli)::int AS share_milli, min(i.gpu_model) AS gpu_model,
                      max(i.mig_profile) AS mig_profile, count(DISTINCT (i.cluster, i.node))::int AS nodes,
                      count(DISTINCT i.allocation_id)::int AS allocations
               FROM gpu_intervals i
               WHERE i.job_id = j.job_id
                 AND i.granted_at = (SELECT max(granted_at) FROM gpu_intervals WHERE job_id = j.job_id)
               HAVING count(*) > 0) r ON TRUE
           ORDER BY j.job_id""", start, end, as_of, list(teams) if teams else None, after, limit)


# --- utilization history -----------------------------------------------------------------------------------------
async def utilization_buckets(conn: asyncpg.Connection, *, job_id: str | None, team: str | None, start: datetime,
                              as_of: datetime, step_s: int, idle_util_pct: float) -> list[asyncpg.Record]:
    """Per bucket of `step_s` from `start`, the rollup minutes of the GPUs the job (or team) held, each weighted by
    the µs it held the GPU during that minute × its share in milli-GPU: `weight` (Σ µs × milli), `util_weight`
    (Σ weight × utilization %), `idle_weight` (Σ weight of minutes at or below the idle threshold), `util_max` and
    the allocations seen. A minute counts in the bucket it starts in; minutes starting before `start` or at or after
    `as_of` are left out."""
    return await conn.fetch(
        """SELECT floor(acct_us($3, r.window_start)::double precision / ($5::double precision * 1000000))::int
                      AS bucket,
                  SUM(x.ov * g.share_milli) AS weight,
                  SUM(x.ov * g.share_milli * r.util_avg_pct) AS util_weight,
                  SUM(CASE WHEN r.util_avg_pct <= $6 THEN x.ov * g.share_milli ELSE 0 END) AS idle_weight,
                  MAX(r.util_avg_pct) AS util_max,
                  COUNT(DISTINCT g.allocation_id) AS allocations
           FROM gpu_intervals g
                JOIN gpu_rollups r ON r.gpu_uuid = g.gpu_uuid AND r.window_start < COALESCE(g.released_at, $4)
                                  AND r.window_end > g.granted_at
                CROSS JOIN LATERAL (SELECT acct_us(GREATEST(r.window_start, g.granted_at),
                                                   LEAST(r.window_end, COALESCE(g.released_at, $4), $4))
                                           ::double precision AS ov) x
           WHERE ($1::text IS NULL OR g.job_id = $1) AND ($2::text IS NULL OR g.team = $2)
             AND g.granted_at < $4 AND (g.released_at IS NULL OR g.released_at > $3)
             AND r.window_start >= $3 AND r.window_start < $4 AND x.ov > 0
           GROUP BY 1 ORDER BY 1""", job_id, team, start, as_of, step_s, idle_util_pct)
