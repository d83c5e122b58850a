"""Every SQL statement of the quota service."""

from __future__ import annotations

import json

import asyncpg


async def ensure_team(conn: asyncpg.Connection, team: str, org: str = "default") -> None:
    await conn.execute("INSERT INTO orgs (org) VALUES ($1) ON CONFLICT DO NOTHING", org)
    await conn.execute("INSERT INTO teams (team, org) VALUES ($1, $2) ON CONFLICT DO NOTHING", team, org)


async def team_exists(conn: asyncpg.Connection, team: str) -> bool:
    return await conn.fetchval("SELECT 1 FROM teams WHERE team = $1", team) is not None


async def team_limits(conn: asyncpg.Connection, team: str) -> dict[str, int | None]:
    rows = await conn.fetch("SELECT gpu_model, guaranteed, borrowing_limit FROM quotas WHERE team = $1", team)
    return {r["gpu_model"]: (None if r["borrowing_limit"] is None else r["guaranteed"] + r["borrowing_limit"])
            for r in rows}


async def list_teams(conn: asyncpg.Connection) -> list[dict]:
    rows = await conn.fetch(
        """SELECT t.team, t.org, coalesce(json_agg(json_build_object(
                      'gpu_model', q.gpu_model, 'guaranteed', q.guaranteed, 'borrowing_limit', q.borrowing_limit,
                      'lending_limit', q.lending_limit, 'over_quota_weight', q.over_quota_weight))
                  FILTER (WHERE q.gpu_model IS NOT NULL), '[]')::text AS quotas
           FROM teams t LEFT JOIN quotas q USING (team) GROUP BY t.team, t.org ORDER BY t.team""")
    return [{"team": r["team"], "org": r["org"], "quotas": json.loads(r["quotas"])} for r in rows]
