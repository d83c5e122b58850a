"""Reading the services' databases for `gpupool check`: every SQL statement of the checker, all of it read-only.

Each database is read in one REPEATABLE READ, READ ONLY transaction on a session whose default is read-only too, so
the checker cannot change what it checks even by mistake. Only the columns the invariants need are read; payloads
only for the subjects they fold (decision cycles can be large)."""

from __future__ import annotations

from typing import Any

import asyncpg

from libs.check.snapshot import OutboxRow, ServiceStore, event_data
from libs.contracts import subjects

# Outbox subjects whose payload the invariants read.
PAYLOAD_SUBJECTS = [subjects.JOB_STATE_CHANGED, subjects.JOB_SUBMITTED, subjects.ALLOCATION_GRANTED,
                    subjects.ALLOCATION_RELEASED, subjects.USAGE_RECORDED]

# service → table → the query that reads it (each only if the table exists)
TABLES: dict[str, dict[str, str]] = {
    "placement": {
        "allocations": """SELECT allocation_id, job_id, replica, team, project, cluster, node, granted_at,
                                 released_at, release_reason, work IS NOT NULL AS work, preempt_deadline,
                                 exit IS NOT NULL AS exited
                          FROM allocations""",
        "allocation_gpus": """SELECT allocation_id, gpu_uuid, gpu_index, model, live, share_milli, memory_mib,
                                     mig_profile, mig_start, mig_slots FROM allocation_gpus""",
        "gpus": "SELECT uuid, model, memory_mib FROM gpus",
        "pending_jobs": "SELECT job_id, satisfied, replicas, submitted_at, reason FROM pending_jobs",
        # only the newest decision matters (liveness): one row, however many are kept
        "decisions": "SELECT max(decided_at) AS latest, count(*) AS n FROM decisions",
        "finished_jobs": "SELECT job_id FROM finished_jobs",
    },
    "inventory": {
        # per node: when it registered, its state, and its GPUs' newest sample (NULL: none ever stored)
        "node_samples": """SELECT n.cluster, n.node, n.state, n.registered_at, n.last_seen_at,
                                  count(g.uuid) AS gpus, max(t.sampled_at) AS latest_sample
                           FROM nodes n LEFT JOIN gpus g ON g.cluster = n.cluster AND g.node = n.node
                           LEFT JOIN gpu_telemetry_latest t ON t.uuid = g.uuid
                           GROUP BY n.cluster, n.node, n.state, n.registered_at, n.last_seen_at""",
    },
    "queue": {
        "jobs": """SELECT job_id, state, team, allocation_id, replicas, gang_nodes, attempts, submitted_at, requeue_at
                   FROM jobs""",
        "job_history": "SELECT job_id, from_state, to_state, reason FROM job_history ORDER BY id",
    },
    "accounting": {
        "gpu_intervals": """SELECT allocation_id, slot, gpu_uuid, share_milli, team, gpu_model, granted_at,
                                   released_at FROM gpu_intervals""",
        "usage_ledger": """SELECT allocation_id, team, gpu_model, gpu_count, share_milli, gpu_milli_us, started_at,
                                  ended_at FROM usage_ledger""",
    },
}
# whose inbox the invariants read (consumer names equal the service names)
INBOX_OF = ("queue", "placement", "accounting")


class StoreUnavailable(RuntimeError):
    """A database could not be reached or read."""


async def read_store(service: str, dsn: str, *, timeout: float = 10.0) -> ServiceStore:
    try:
        conn = await asyncpg.connect(dsn, timeout=timeout, command_timeout=60,
                                     server_settings={"default_transaction_read_only": "on",
                                                      "application_name": "gpupool-check"})
    except (OSError, asyncpg.PostgresError, TimeoutError) as exc:
        raise StoreUnavailable(f"{service}: cannot connect to its database: {exc}") from exc
    try:
        async with conn.transaction(isolation="repeatable_read", readonly=True):
            now = await conn.fetchval("SELECT now()")
            present = {r["name"] for r in await conn.fetch(
                "SELECT tablename AS name FROM pg_tables WHERE schemaname = current_schema()")}
            store = ServiceStore(service=service, now=now)
            if "outbox" in present:
                store.outbox = [OutboxRow(
                    seq=r["seq"], event_id=r["event_id"], subject=r["subject"], created_at=r["created_at"],
                    published_at=r["published_at"], attempts=r["attempts"], last_error=r["last_error"],
                    data=event_data(r["payload"])) for r in await conn.fetch(
                    """SELECT seq, event_id, subject, created_at, published_at, attempts, last_error,
                              CASE WHEN subject = ANY($1::text[]) THEN payload END AS payload
                       FROM outbox ORDER BY seq""", PAYLOAD_SUBJECTS)]
            if "store_retention" in present:
                horizons = {r["what"]: r["pruned_before"] for r in await conn.fetch(
                    "SELECT what, pruned_before FROM store_retention")}
                store.outbox_pruned_before = horizons.get("outbox")
                store.inbox_pruned_before = horizons.get("inbox")
            if "inbox" in present and service in INBOX_OF:
                for r in await conn.fetch("SELECT consumer, event_id FROM inbox"):
                    store.inbox.setdefault(r["consumer"], set()).add(r["event_id"])
            for table, sql in TABLES.get(service, {}).items():
                if table in present:
                    store.tables[table] = [dict(r) for r in await conn.fetch(sql)]
            return store
    except asyncpg.PostgresError as exc:
        raise StoreUnavailable(f"{service}: reading its database failed: {exc}") from exc
    finally:
        await conn.close()


async def outbox_has(dsn: str, event_ids: list[str]) -> set[str]:
    """Which of these event ids the database's outbox holds now (a second look at events newer than a snapshot)."""
    return await _which(dsn, "SELECT event_id AS id FROM outbox WHERE event_id = ANY($1::text[])", event_ids)


async def jobs_exist(dsn: str, job_ids: list[str]) -> set[str]:
    """Which of these jobs the queue holds now (a second look at jobs newer than its snapshot)."""
    return await _which(dsn, "SELECT job_id AS id FROM jobs WHERE job_id = ANY($1::text[])", job_ids)


async def _which(dsn: str, sql: str, ids: list[str]) -> set[str]:
    if not ids:
        return set()
    conn = await asyncpg.connect(dsn, timeout=10, server_settings={"default_transaction_read_only": "on"})
    try:
        rows: list[Any] = await conn.fetch(sql, ids)
        return {r["id"] for r in rows}
    finally:
        await conn.close()
