"""Quota service: owns the org → team → project tree and answers admission at submit."""

from __future__ import annotations

from libs.contracts import subjects
from libs.contracts.commands import AdmitJob, Empty, Reply
from libs.runtime.routes import Routes
from libs.runtime.service import ServiceRuntime
from services.quota import store
from services.quota.domain import admit


class QuotaHandlers:
    def __init__(self, runtime: ServiceRuntime) -> None:
        self.rt = runtime

    async def seed(self, teams: list[str]) -> None:
        async with self.rt.pool.acquire() as conn:
            for team in teams:
                await store.ensure_team(conn, team)

    async def admit(self, cmd: AdmitJob) -> Reply:
        async with self.rt.pool.acquire() as conn:
            exists = await store.team_exists(conn, cmd.team)
            limits = await store.team_limits(conn, cmd.team) if exists else {}
        return admit(cmd, team_exists=exists, limits=limits)

    async def list_teams(self, _: Empty) -> Reply:
        async with self.rt.pool.acquire() as conn:
            return Reply.success({"items": await store.list_teams(conn), "next": None})


def routes(h: QuotaHandlers) -> Routes:
    return Routes(
        commands={
            subjects.CMD_QUOTA_ADMIT: (AdmitJob, h.admit),
            subjects.QUERY_QUOTA_LIST_TEAMS: (Empty, h.list_teams),
        },
    )
