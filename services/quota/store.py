"""Every SQL statement of the quota service."""

from __future__ import annotations

from typing import Any

import asyncpg

from libs.contracts.commands import SetPriorityClass, SetQuota

_QUOTA_COLUMNS = "path, gpu_model, guaranteed, borrowing_limit, lending_limit, weight, revision, updated_at"
_CLASS_COLUMNS = "name, value, preemptible, min_runtime_s, description, revision, updated_at"


async def ensure_team(conn: asyncpg.Connection, team: str, org: str = "default") -> asyncpg.Record | None:
    """Create the team (and its org); the new row, or None if it existed."""
    await conn.execute("INSERT INTO orgs (org) VALUES ($1) ON CONFLICT DO NOTHING", org)
    return await conn.fetchrow(
        """INSERT INTO teams (team, org) VALUES ($1, $2) ON CONFLICT DO NOTHING
           RETURNING team, org, revision, created_at""", team, org)


async def org_exists(conn: asyncpg.Connection, org: str) -> bool:
    return bool(await conn.fetchval("SELECT EXISTS (SELECT 1 FROM orgs WHERE org = $1)", org))


async def get_team(conn: asyncpg.Connection, team: str) -> asyncpg.Record | None:
    return await conn.fetchrow("SELECT team, org, revision, created_at FROM teams WHERE team = $1", team)


async def priority_class(conn: asyncpg.Connection, name: str) -> asyncpg.Record | None:
    return await conn.fetchrow(f"SELECT {_CLASS_COLUMNS} FROM priority_classes WHERE name = $1", name)


async def admission_inputs(conn: asyncpg.Connection, team: str, priority_class: str) -> dict[str, Any]:
    """Everything admission reads, in one round trip (it runs for every submitted job): the team, the priority
    class, the team's own and its org's effective quota entries (a team can never hold more than either allows),
    and the approval rules."""
    row = await conn.fetchrow(
        """SELECT t.team, t.org, c.name, c.value, c.preemptible,
                  e.models, e.guaranteed, e.borrowing, r.rules, r.rule_values, r.enabled
           FROM (SELECT 1) one
           LEFT JOIN teams t ON t.team = $1
           LEFT JOIN priority_classes c ON c.name = $2
           LEFT JOIN LATERAL (
               SELECT array_agg(q.gpu_model) AS models, array_agg(q.guaranteed) AS guaranteed,
                      array_agg(q.borrowing_limit) AS borrowing
               FROM quota_entries_effective q WHERE q.path = t.org || '/' || t.team OR q.path = t.org) e ON true
           CROSS JOIN LATERAL (
               SELECT array_agg(rule ORDER BY rule) AS rules, array_agg(value ORDER BY rule) AS rule_values,
                      array_agg(enabled ORDER BY rule) AS enabled FROM approval_rules) r""", team, priority_class)
    return {
        "team": {"team": row["team"], "org": row["org"]} if row["team"] is not None else None,
        "priority_class": {"name": row["name"], "value": row["value"], "preemptible": row["preemptible"]}
        if row["name"] is not None else None,
        "entries": [{"gpu_model": m, "guaranteed": g, "borrowing_limit": b}
                    for m, g, b in zip(row["models"] or [], row["guaranteed"] or [], row["borrowing"] or [],
                                       strict=True)],
        "rules": [{"rule": r, "value": v, "enabled": e}
                  for r, v, e in zip(row["rules"] or [], row["rule_values"] or [], row["enabled"] or [], strict=True)],
    }


async def get_quota(conn: asyncpg.Connection, path: str, gpu_model: str) -> asyncpg.Record | None:
    """The entry as placement must see it: its guarantee includes active loans (`loaned`, `base_guaranteed`)."""
    return await conn.fetchrow(
        f"SELECT {_QUOTA_COLUMNS}, base_guaranteed, loaned FROM quota_entries_effective WHERE path = $1 AND gpu_model = $2",
        path, gpu_model)


async def upsert_quota(conn: asyncpg.Connection, cmd: SetQuota) -> asyncpg.Record:
    return await conn.fetchrow(
        f"""INSERT INTO quota_entries (path, gpu_model, guaranteed, borrowing_limit, lending_limit, weight)
            VALUES ($1,$2,$3,$4,$5,$6)
            ON CONFLICT (path, gpu_model) DO UPDATE SET guaranteed = EXCLUDED.guaranteed,
                borrowing_limit = EXCLUDED.borrowing_limit, lending_limit = EXCLUDED.lending_limit,
                weight = EXCLUDED.weight, revision = nextval('policy_revision'), updated_at = now()
            RETURNING {_QUOTA_COLUMNS}""",
        cmd.path, cmd.gpu_model, cmd.guaranteed, cmd.borrowing_limit, cmd.lending_limit, cmd.weight)


async def delete_quota(conn: asyncpg.Connection, path: str, gpu_model: str) -> tuple[asyncpg.Record | None, int]:
    row = await conn.fetchrow(f"DELETE FROM quota_entries WHERE path = $1 AND gpu_model = $2 RETURNING {_QUOTA_COLUMNS}",
                              path, gpu_model)
    return row, await conn.fetchval("SELECT nextval('policy_revision')")


async def upsert_priority_class(conn: asyncpg.Connection, cmd: SetPriorityClass) -> asyncpg.Record:
    return await conn.fetchrow(
        f"""INSERT INTO priority_classes (name, value, preemptible, min_runtime_s, description)
            VALUES ($1,$2,$3,$4,$5)
            ON CONFLICT (name) DO UPDATE SET value = EXCLUDED.value, preemptible = EXCLUDED.preemptible,
                min_runtime_s = EXCLUDED.min_runtime_s, description = EXCLUDED.description,
                revision = nextval('policy_revision'), updated_at = now()
            RETURNING {_CLASS_COLUMNS}""",
        cmd.name, cmd.value, cmd.preemptible, cmd.min_runtime_s, cmd.description)


async def policy(conn: asyncpg.Connection) -> dict[str, list[dict]]:
    teams = await conn.fetch("SELECT team, org, revision FROM teams ORDER BY team")
    quotas = await conn.fetch(f"SELECT {_QUOTA_COLUMNS} FROM quota_entries_effective ORDER BY path, gpu_model")
    classes = await conn.fetch(f"SELECT {_CLASS_COLUMNS} FROM priority_classes ORDER BY value DESC, name")
    # the highest revision this service has handed out: a read model holding a higher one holds a forgery
    revision_max = await conn.fetchval("SELECT last_value FROM policy_revision")
    return {
        "revision_max": int(revision_max),
        "teams": [dict(r) for r in teams],
        "quotas": [{**dict(r), "updated_at": r["updated_at"].isoformat()} for r in quotas],
        "priority_classes": [{**dict(r), "updated_at": r["updated_at"].isoformat()} for r in classes],
    }


async def list_teams(conn: asyncpg.Connection) -> list[dict]:
    teams = await conn.fetch("SELECT team, org FROM teams ORDER BY team")
    quotas = await conn.fetch(f"SELECT {_QUOTA_COLUMNS}, loaned FROM quota_entries_effective ORDER BY path, gpu_model")
    out = []
    for t in teams:
        own = f"{t['org']}/{t['team']}"
        out.append({"team": t["team"], "org": t["org"], "quotas": [
            {"path": q["path"], "gpu_model": q["gpu_model"], "guaranteed": q["guaranteed"],
             "borrowing_limit": q["borrowing_limit"], "lending_limit": q["lending_limit"],
             "over_quota_weight": q["weight"], "loaned": q["loaned"]}
            for q in quotas if q["path"] == own or q["path"].startswith(own + "/")]})
    return out


# --- approvals ----------------------------------------------------------------------------------------------------
_APPROVAL_COLUMNS = ("approval_id, job_id, job_name, team, project, gpus, priority_class, reasons, requested_by, "
                     "state, comment, decided_by, created_at, decided_at, kind, loan_path, loan_gpu_model, loan_until")


async def approval_rules(conn: asyncpg.Connection) -> list[asyncpg.Record]:
    return await conn.fetch("SELECT rule, value, enabled FROM approval_rules ORDER BY rule")


async def set_approval_rule(conn: asyncpg.Connection, rule: str, value: str, enabled: bool) -> asyncpg.Record:
    return await conn.fetchrow(
        """INSERT INTO approval_rules (rule, value, enabled) VALUES ($1,$2,$3)
           ON CONFLICT (rule) DO UPDATE SET value = EXCLUDED.value, enabled = EXCLUDED.enabled, updated_at = now()
           RETURNING rule, value, enabled""", rule, value, enabled)


async def insert_approval(conn: asyncpg.Connection, **row: object) -> asyncpg.Record:
    return await conn.fetchrow(
        f"""INSERT INTO approval_requests (approval_id, job_id, job_name, team, project, gpus, priority_class,
                                          reasons, requested_by)
            VALUES ($1,$2,$3,$4,$5,$6,$7,$8,$9)
            ON CONFLICT (job_id) DO UPDATE SET job_id = EXCLUDED.job_id
            RETURNING {_APPROVAL_COLUMNS}, (xmax = 0) AS inserted""",
        row["approval_id"], row["job_id"], row["job_name"], row["team"], row["project"], row["gpus"],
        row["priority_class"], row["reasons"], row["requested_by"])


async def decide_approval(conn: asyncpg.Connection, approval_id: str, approved: bool, comment: str,
                          decided_by: str) -> asyncpg.Record | None:
    """Decide a pending request; None if it does not exist or was already decided."""
    return await conn.fetchrow(
        f"""UPDATE approval_requests SET state = $2, comment = $3, decided_by = $4, decided_at = now()
            WHERE approval_id = $1 AND state = 'pending' RETURNING {_APPROVAL_COLUMNS}""",
        approval_id, "approved" if approved else "denied", comment, decided_by)


async def get_approval(conn: asyncpg.Connection, approval_id: str) -> asyncpg.Record | None:
    return await conn.fetchrow(f"SELECT {_APPROVAL_COLUMNS} FROM approval_requests WHERE approval_id = $1",
                               approval_id)


async def list_approvals(conn: asyncpg.Connection, *, team: str | None, state: str | None, approval_id: str | None,
                         limit: int, job_id: str | None = None, before: str | None = None,
                         kind: str | None = None) -> list[asyncpg.Record]:
    return await conn.fetch(
        f"""SELECT {_APPROVAL_COLUMNS} FROM approval_requests
            WHERE ($1::text IS NULL OR team = $1) AND ($2::text IS NULL OR state = $2)
              AND ($3::text IS NULL OR approval_id = $3) AND ($5::text IS NULL OR job_id = $5)
              AND ($6::text IS NULL OR approval_id < $6) AND ($7::text IS NULL OR kind = $7)
            ORDER BY approval_id DESC LIMIT $4""", team, state, approval_id, limit, job_id, before, kind)


async def withdraw_approval(conn: asyncpg.Connection, job_id: str, reason: str) -> asyncpg.Record | None:
    """The job's request, if still pending, is withdrawn; None otherwise (none, or already decided)."""
    return await conn.fetchrow(
        f"""UPDATE approval_requests SET state = 'withdrawn', comment = $2, decided_at = now()
            WHERE job_id = $1 AND state = 'pending' RETURNING {_APPROVAL_COLUMNS}""", job_id, reason)


# --- quota loans ----------------------------------------------------------------------------------------------------
async def insert_loan_request(conn: asyncpg.Connection, **row: object) -> asyncpg.Record:
    return await conn.fetchrow(
        f"""INSERT INTO approval_requests (approval_id, job_id, job_name, team, project, gpus, priority_class,
                                          reasons, requested_by, kind, loan_path, loan_gpu_model, loan_until)
            VALUES ($1, NULL, $2, $3, $4, $5, '', $6, $7, 'loan', $8, $9, $10) RETURNING {_APPROVAL_COLUMNS}""",
        row["approval_id"], row["job_name"], row["team"], row["project"], row["gpus"], row["reasons"],
        row["requested_by"], row["path"], row["gpu_model"], row["until"])


async def grant_loan(conn: asyncpg.Connection, approval: asyncpg.Record, granted_by: str) -> None:
    """Lend the approved extra guarantee, creating the entry (guarantee 0) if the tree had none, and give the entry
    a new revision so read models take its new effective guarantee."""
    await conn.execute(
        """INSERT INTO quota_loans (loan_id, path, gpu_model, gpus, until, reason, granted_by)
           VALUES ($1,$2,$3,$4,$5,$6,$7) ON CONFLICT DO NOTHING""",
        approval["approval_id"], approval["loan_path"], approval["loan_gpu_model"], float(approval["gpus"]),
        approval["loan_until"], "; ".join(approval["reasons"]), granted_by)
    await touch_entry(conn, approval["loan_path"], approval["loan_gpu_model"])


async def touch_entry(conn: asyncpg.Connection, path: str, gpu_model: str) -> None:
    await conn.execute(
        """INSERT INTO quota_entries (path, gpu_model, guaranteed) VALUES ($1, $2, 0)
           ON CONFLICT (path, gpu_model) DO UPDATE SET revision = nextval('policy_revision'), updated_at = now()""",
        path, gpu_model)


async def expire_loans(conn: asyncpg.Connection) -> list[asyncpg.Record]:
    """Loans whose date passed, marked so each end is announced once (rows locked, skipping a concurrent sweep)."""
    return await conn.fetch(
        """UPDATE quota_loans SET expired_at = now()
           WHERE loan_id IN (SELECT loan_id FROM quota_loans WHERE expired_at IS NULL AND until <= now()
                             FOR UPDATE SKIP LOCKED)
           RETURNING loan_id, path, gpu_model, gpus, until""")


async def list_loans(conn: asyncpg.Connection, *, active_only: bool) -> list[asyncpg.Record]:
    return await conn.fetch(
        """SELECT loan_id, path, gpu_model, gpus, until, reason, granted_by, granted_at, expired_at,
                  (expired_at IS NULL AND until > now()) AS active
           FROM quota_loans WHERE NOT $1 OR (expired_at IS NULL AND until > now()) ORDER BY granted_at DESC""",
        active_only)
