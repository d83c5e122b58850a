"""Every SQL statement of the queue service."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

import asyncpg

from libs.contracts.autoscale import AutoscalePolicy
from libs.contracts.commands import JobView
from libs.contracts.work import WorkSpec
from libs.observability.tracing import trace_id_of
from libs.store.unit_of_work import OutboxRow, outbox_args, outbox_cte

_COLUMNS = ("job_id, name, team, project, kind, priority_class, priority, attempts, gang_nodes, gpus_per_node, "
            "replicas, max_runtime_s, gpus, gpu_models, state, submitted_at, "
            "started_at, finished_at, allocation_id, node, cluster, message, gpu_fraction_milli, gpu_memory_mib, "
            "mig_profile, exclusive, submitted_by, work, exit_code, reason, restarts, attempt_failure, "
            "min_replicas, max_replicas, autoscale, cpu_milli, memory_mib, node_selector, preemptible, traceparent")


def work_of(row: asyncpg.Record) -> WorkSpec | None:
    """The job's work spec (stored as JSON text), or None for a job that launches nothing."""
    raw = row["work"]
    return WorkSpec.model_validate_json(raw) if raw else None


def failure_of(row: asyncpg.Record) -> dict[str, Any] | None:
    raw = row["attempt_failure"]
    return json.loads(raw) if raw else None


def autoscale_of(row: asyncpg.Record) -> AutoscalePolicy | None:
    raw = row["autoscale"]
    return AutoscalePolicy.model_validate_json(raw) if raw else None


def selector_of(row: asyncpg.Record) -> dict[str, str]:
    raw = row["node_selector"]
    return json.loads(raw) if isinstance(raw, str) else dict(raw or {})


def to_view(row: asyncpg.Record) -> JobView:
    return JobView(**{k: row[k] for k in JobView.model_fields if k not in ("work", "autoscale", "node_selector")},
                   work=work_of(row), autoscale=autoscale_of(row), node_selector=selector_of(row))


def view_data(row: asyncpg.Record) -> dict[str, Any]:
    """The job as its view's JSON, with the id of the trace its life is recorded in (`trace_id`, None for a job
    submitted before traces were kept)."""
    return to_view(row).model_dump(mode="json") | {"trace_id": trace_id_of(row["traceparent"])}


async def find_by_idempotency_key(conn: asyncpg.Connection, scope: str, key: str) -> asyncpg.Record | None:
    return await conn.fetchrow(
        f"SELECT {_COLUMNS}, request_hash FROM jobs WHERE idempotency_scope = $1 AND idempotency_key = $2",
        scope, key)


async def insert_job(conn: asyncpg.Connection, job: dict[str, Any]) -> asyncpg.Record:
    """The job and its first history entry in one statement (one round trip); None if the idempotency key was
    taken meanwhile (nothing written)."""
    return await conn.fetchrow(
        f"""WITH j AS (
              INSERT INTO jobs (job_id, name, team, project, kind, priority_class, priority, gpus, gpu_models, state,
                                submitted_by, submitted_at, idempotency_key, request_hash, message, gang_nodes,
                                gpus_per_node, replicas, max_runtime_s, gpu_fraction_milli, gpu_memory_mib,
                                mig_profile, exclusive, approval_id, work, reason, idempotency_scope,
                                min_replicas, max_replicas, autoscale, cpu_milli, memory_mib, node_selector,
                                preemptible, traceparent)
              VALUES ($1,$2,$3,$4,$5,$6,$7,$8,$9,$19,$10,$11,$12,$13,$14,$15,$16,$17,$18,$20,$21,$22,$23,$24,
                      $26::jsonb, $25, $27, $28, $29, $30, $31, $32, $33::jsonb, $34, $35)
              ON CONFLICT (idempotency_scope, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
              RETURNING {_COLUMNS}),
            h AS (INSERT INTO job_history (job_id, from_state, to_state, reason)
                  SELECT job_id, NULL, state, $25 FROM j)
            SELECT * FROM j""",
        job["job_id"], job["name"], job["team"], job["project"], job["kind"], job["priority_class"],
        job["priority"], job["gpus"], job["gpu_models"], job["submitted_by"], job["submitted_at"],
        job["idempotency_key"], job["request_hash"], job.get("message", "waiting for placement"), job["gang_nodes"],
        job["gpus_per_node"], job["replicas"], job["max_runtime_s"], job["state"], job["gpu_fraction_milli"],
        job["gpu_memory_mib"], job["mig_profile"], job["exclusive"], job.get("approval_id"),
        "AwaitingApproval" if job["state"] == "awaiting_approval" else "Submitted",
        job["work"].model_dump_json() if job.get("work") is not None else None, job.get("idempotency_scope", ""),
        job.get("min_replicas"), job.get("max_replicas"),
        job["autoscale"].model_dump_json() if job.get("autoscale") is not None else None,
        job.get("cpu_milli", 0), job.get("memory_mib", 0), json.dumps(job.get("node_selector") or {}, sort_keys=True),
        job.get("preemptible"), job.get("traceparent"))


async def get_job(conn: asyncpg.Connection, job_id: str, *, for_update: bool = False) -> asyncpg.Record | None:
    lock = " FOR UPDATE" if for_update else ""
    return await conn.fetchrow(f"SELECT {_COLUMNS} FROM jobs WHERE job_id = $1{lock}", job_id)


async def list_jobs(conn: asyncpg.Connection, *, team: str | None, state: str | None, limit: int,
                    after: str | None) -> list[asyncpg.Record]:
    return await conn.fetch(
        f"""SELECT {_COLUMNS} FROM jobs
            WHERE ($1::text IS NULL OR team = $1) AND ($2::text IS NULL OR state = $2)
              AND ($3::text IS NULL OR job_id > $3)
            ORDER BY job_id LIMIT $4""",
        team, state, after, limit)


# states a job leaves for `pending` when it is requeued (and its attempt count goes up)
REQUEUED_FROM = ("launching", "running", "preempting")


async def set_state(conn: asyncpg.Connection, job_id: str, current: str, target: str, reason: str, *,
                    at: datetime, message: str | None = None, outbox: list[OutboxRow] | None = None,
                    **fields: Any) -> asyncpg.Record:
    """The transition, its history entry and `outbox` (a unit of work's `take_outbox()`: the events announcing it)
    in one statement (one round trip); returns the updated job. The job's row is locked already (`get_job`), so
    the update finds it and the events are never written without it."""
    sets = ["state = $2", "message = $3", "reason = $5"]
    args: list[Any] = [job_id, target, message, current, reason]
    if target == "running":
        sets.append(f"started_at = ${len(args) + 1}")
        args.append(at)
    if target == "pending" and current in REQUEUED_FROM:
        sets.append("attempts = attempts + 1")  # a requeue: the job will start again
        sets.append("attempt_failure = NULL")
    if fields.pop("restarted", False):
        sets.append("restarts = restarts + 1")
    if "attempt_failure" in fields:
        sets.append(f"attempt_failure = ${len(args) + 1}::jsonb")
        args.append(json.dumps(fields.pop("attempt_failure")))
    if target in ("completed", "cancelled", "failed"):
        sets.append(f"finished_at = ${len(args) + 1}")
        args.append(at)
    for column in ("allocation_id", "node", "cluster", "exit_code"):
        if column in fields:
            sets.append(f"{column} = ${len(args) + 1}")
            args.append(fields[column])
    events = ""
    if outbox:
        events = f", o AS ({outbox_cte(len(args) + 1)})"
        args += outbox_args(outbox)
    return await conn.fetchrow(
        f"""WITH u AS (UPDATE jobs SET {', '.join(sets)} WHERE job_id = $1 RETURNING {_COLUMNS}),
                 h AS (INSERT INTO job_history (job_id, from_state, to_state, reason)
                       SELECT job_id, $4::text, $2::text, $5::text FROM u){events}
            SELECT * FROM u""", *args)


async def remember_failure(conn: asyncpg.Connection, job_id: str, failure: dict[str, Any]) -> None:
    """The first failure of the attempt, kept until its last member ended."""
    await conn.execute("UPDATE jobs SET attempt_failure = $2::jsonb WHERE job_id = $1 AND attempt_failure IS NULL",
                       job_id, json.dumps(failure))


async def report_load(conn: asyncpg.Connection, job_id: str, reporter: str, value: float, at: datetime) -> None:
    await conn.execute(
        """INSERT INTO autoscale_load (job_id, reporter, value, at) VALUES ($1, $2, $3, $4)
           ON CONFLICT (job_id, reporter) DO UPDATE SET value = EXCLUDED.value, at = EXCLUDED.at
           WHERE autoscale_load.at <= EXCLUDED.at""",  # a late (replayed) sample never replaces a newer one
        job_id, reporter, value, at)


async def forget_load(conn: asyncpg.Connection, job_id: str) -> None:
    """The job ended: its load reports are of no further use."""
    await conn.execute("DELETE FROM autoscale_load WHERE job_id = $1", job_id)


async def autoscaled_jobs(conn: asyncpg.Connection) -> list[str]:
    rows = await conn.fetch("""SELECT job_id FROM jobs WHERE autoscale IS NOT NULL
                               AND state IN ('pending', 'launching', 'running', 'preempting') ORDER BY job_id""")
    return [r["job_id"] for r in rows]


async def autoscale_inputs(conn: asyncpg.Connection, job_id: str) -> tuple[asyncpg.Record, list[asyncpg.Record]] | None:
    """The job (locked) with its scaling state, and each reporter's latest load."""
    row = await conn.fetchrow(f"SELECT {_COLUMNS}, scaled_at, autoscale_recs FROM jobs WHERE job_id = $1 FOR UPDATE",
                              job_id)
    if row is None:
        return None
    return row, await conn.fetch("SELECT reporter, value, at FROM autoscale_load WHERE job_id = $1", job_id)


async def save_autoscale(conn: asyncpg.Connection, job_id: str, recommendations: list, scaled_at: datetime | None,
                         replicas: int | None) -> None:
    await conn.execute(
        """UPDATE jobs SET autoscale_recs = $2, scaled_at = coalesce($3, scaled_at), replicas = coalesce($4, replicas)
           WHERE job_id = $1""", job_id, json.dumps(recommendations), scaled_at, replicas)


async def set_work(conn: asyncpg.Connection, job_id: str, work: WorkSpec) -> int:
    """The job's new work; returns its revision."""
    return await conn.fetchval(
        "UPDATE jobs SET work = $2::jsonb, work_revision = work_revision + 1 WHERE job_id = $1 RETURNING work_revision",
        job_id, work.model_dump_json())


async def set_replicas(conn: asyncpg.Connection, job_id: str, replicas: int) -> None:
    await conn.execute("UPDATE jobs SET replicas = $2 WHERE job_id = $1", job_id, replicas)


async def record_history(conn: asyncpg.Connection, job_id: str, from_state: str | None, to_state: str,
                         reason: str) -> None:
    await conn.execute("INSERT INTO job_history (job_id, from_state, to_state, reason) VALUES ($1,$2,$3,$4)",
                       job_id, from_state, to_state, reason)


async def history(conn: asyncpg.Connection, job_id: str) -> list[asyncpg.Record]:
    return await conn.fetch(
        "SELECT at, from_state, to_state, reason FROM job_history WHERE job_id = $1 ORDER BY id", job_id)


async def open_job_counts(conn: asyncpg.Connection) -> list[asyncpg.Record]:
    """Jobs not yet finished, by team, priority class and state (for /metrics)."""
    return await conn.fetch(
        """SELECT team, priority_class, state, count(*) AS n FROM jobs
           WHERE state IN ('awaiting_approval', 'pending', 'launching', 'running', 'preempting')
           GROUP BY team, priority_class, state""")


async def set_requeue_at(conn: asyncpg.Connection, job_id: str, at: datetime | None) -> None:
    await conn.execute("UPDATE jobs SET requeue_at = $2 WHERE job_id = $1", job_id, at)


async def due_requeues(conn: asyncpg.Connection, now: datetime, limit: int = 100) -> list[asyncpg.Record]:
    """Pending jobs whose back-off is over, locked (a concurrent replica skips them), their back-off cleared."""
    return await conn.fetch(
        f"""UPDATE jobs SET requeue_at = NULL
            WHERE job_id IN (SELECT job_id FROM jobs WHERE requeue_at <= $1 AND state = 'pending'
                             ORDER BY requeue_at LIMIT $2 FOR UPDATE SKIP LOCKED)
            RETURNING {_COLUMNS}""", now, limit)


async def backlog_counts(conn: asyncpg.Connection, cap: int, window_s: float) -> tuple[int, int]:
    """(jobs waiting for placement (state pending) counted up to `cap` at most — the admission limit needs no more,
    and the count's cost stays bounded however long the queue grows —, jobs granted in the last `window_s` seconds
    by any replica: the ones whose last start is that recent)."""
    row = await conn.fetchrow(
        """SELECT (SELECT count(*) FROM (SELECT 1 FROM jobs WHERE state = 'pending' LIMIT $1) AS waiting),
                  (SELECT count(*) FROM jobs WHERE started_at > now() - make_interval(secs => $2))""", cap, window_s)
    return row[0], row[1]
