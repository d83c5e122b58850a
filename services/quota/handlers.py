"""Quota service: owns the org → team → project tree, quotas on every level, priority classes, and admission.

Every change is written with its event (outbox) carrying the row's full new state and a revision, so placement's
read model converges whatever order it sees changes in.
"""

from __future__ import annotations

from libs.contracts import subjects
from libs.contracts.commands import (
    AdmitJob,
    CreateTeam,
    DecideApproval,
    Empty,
    ListApprovals,
    Reply,
    SetApprovalRule,
    SetPriorityClass,
    SetQuota,
    page,
)
from libs.contracts.envelope import CloudEvent, utcnow, uuid7
from libs.contracts.events import (
    ApprovalDecided,
    ApprovalRequested,
    ApprovalWithdrawn,
    JobCancelled,
    PriorityClassSet,
    QuotaSet,
    TeamCreated,
)
from libs.runtime.routes import Routes
from libs.runtime.service import ServiceRuntime
from services.quota import store
from services.quota.domain import admit, approval_reasons

CONSUMER = "quota"


def _quota_event(row, *, deleted: bool = False, revision: int | None = None) -> QuotaSet:  # type: ignore[no-untyped-def]
    return QuotaSet(path=row["path"], gpu_model=row["gpu_model"], guaranteed=row["guaranteed"],
                    borrowing_limit=row["borrowing_limit"], lending_limit=row["lending_limit"], weight=row["weight"],
                    deleted=deleted, revision=revision or row["revision"], set_at=utcnow())


def _view(row) -> dict:  # type: ignore[no-untyped-def]
    doc = dict(row)
    if "updated_at" in doc:
        doc["updated_at"] = doc["updated_at"].isoformat()
    if "created_at" in doc:
        doc["created_at"] = doc["created_at"].isoformat()
    return doc


class QuotaHandlers:
    def __init__(self, runtime: ServiceRuntime) -> None:
        self.rt = runtime

    async def seed(self, teams: list[str]) -> None:
        for team in teams:
            await self.create_team(CreateTeam(team=team))

    async def create_team(self, cmd: CreateTeam) -> Reply:
        async with self.rt.uow() as uow:
            row = await store.ensure_team(uow.conn, cmd.team, cmd.org)
            if row is None:
                existing = await store.get_team(uow.conn, cmd.team)
                if existing["org"] != cmd.org:
                    return Reply.failure(409, "TeamExists", f"team {cmd.team!r} exists in org {existing['org']!r}")
                return Reply.success(_view(existing) | {"created": False})
            await uow.emit(TeamCreated(team=row["team"], org=row["org"], revision=row["revision"],
                                       created_at=row["created_at"]))
        return Reply.success(_view(row) | {"created": True})

    async def set_quota(self, cmd: SetQuota) -> Reply:
        async with self.rt.uow() as uow:
            before = await store.get_quota(uow.conn, cmd.path, cmd.gpu_model)
            if cmd.delete:
                if before is None:
                    return Reply.failure(404, "QuotaNotFound", f"no quota for {cmd.path} / {cmd.gpu_model}")
                row, revision = await store.delete_quota(uow.conn, cmd.path, cmd.gpu_model)
                await uow.emit(_quota_event(row, deleted=True, revision=revision))
                return Reply.success({"before": _view(before), "after": None})
            if cmd.lending_limit is not None and cmd.lending_limit > cmd.guaranteed:
                return Reply.failure(422, "InvalidQuota", "a lending limit cannot exceed what is guaranteed")
            row = await store.upsert_quota(uow.conn, cmd)
            await uow.emit(_quota_event(row))
        return Reply.success({"before": _view(before) if before else None, "after": _view(row)})

    async def set_priority_class(self, cmd: SetPriorityClass) -> Reply:
        async with self.rt.uow() as uow:
            before = await store.priority_class(uow.conn, cmd.name)
            row = await store.upsert_priority_class(uow.conn, cmd)
            await uow.emit(PriorityClassSet(name=row["name"], value=row["value"], preemptible=row["preemptible"],
                                            min_runtime_s=row["min_runtime_s"], description=row["description"],
                                            revision=row["revision"], set_at=row["updated_at"]))
        return Reply.success({"before": _view(before) if before else None, "after": _view(row)})

    async def admit(self, cmd: AdmitJob) -> Reply:
        """Reject, admit, or admit pending a person's approval (the request is recorded here, keyed by the job id
        the queue will use, so a retried submission finds the same request)."""
        async with self.rt.pool.acquire() as conn:
            team = await store.get_team(conn, cmd.team)
            klass = await store.priority_class(conn, cmd.priority_class)
            entries = await store.team_quota_rows(conn, team["org"], cmd.team) if team else []
            reply = admit(cmd, team=team, priority_class=klass, quota_entries=entries)
            if not reply.ok or cmd.job_id is None:
                return reply
            reasons = approval_reasons(cmd, await store.approval_rules(conn))
            if not reasons:
                return reply
        async with self.rt.uow() as uow:
            row = await store.insert_approval(
                uow.conn, approval_id=uuid7(), job_id=cmd.job_id, job_name=cmd.job_name, team=cmd.team,
                project=cmd.project, gpus=cmd.gpus, priority_class=cmd.priority_class, reasons=reasons,
                requested_by=cmd.submitted_by)
            if row["inserted"]:  # a retried submission finds its request again: announced once
                await uow.emit(ApprovalRequested(
                    approval_id=row["approval_id"], job_id=row["job_id"], job_name=row["job_name"],
                    team=row["team"], project=row["project"], gpus=row["gpus"], priority_class=row["priority_class"],
                    reasons=list(row["reasons"]), requested_by=row["requested_by"], requested_at=row["created_at"]))
        return Reply.success({**reply.result, "approval_required": True, "approval_id": row["approval_id"],
                              "approval_reasons": reasons})

    async def set_approval_rule(self, cmd: SetApprovalRule) -> Reply:
        if cmd.rule != "priority_class":
            try:
                float(cmd.value)
            except ValueError:
                return Reply.failure(422, "InvalidRule", f"{cmd.rule} needs a number, got {cmd.value!r}")
        async with self.rt.pool.acquire() as conn:
            return Reply.success(dict(await store.set_approval_rule(conn, cmd.rule, cmd.value, cmd.enabled)))

    async def decide_approval(self, cmd: DecideApproval) -> Reply:
        async with self.rt.uow() as uow:
            row = await store.decide_approval(uow.conn, cmd.approval_id, cmd.approve, cmd.comment, cmd.decided_by)
            if row is None:
                existing = await store.get_approval(uow.conn, cmd.approval_id)
                if existing is None:
                    return Reply.failure(404, "ApprovalNotFound", f"no approval request {cmd.approval_id}")
                return Reply.failure(409, "AlreadyDecided", f"approval {cmd.approval_id} was already "
                                                            f"{existing['state']}")
            await uow.emit(ApprovalDecided(approval_id=row["approval_id"], job_id=row["job_id"], team=row["team"],
                                           approved=cmd.approve, comment=cmd.comment, decided_by=cmd.decided_by,
                                           decided_at=row["decided_at"]))
        return Reply.success(_view(row))

    async def approvals(self, cmd: ListApprovals) -> Reply:
        async with self.rt.pool.acquire() as conn:
            rows = await store.list_approvals(conn, team=cmd.team, state=cmd.state, approval_id=cmd.approval_id,
                                              job_id=cmd.job_id, limit=cmd.limit + 1, before=cmd.before)
            rules = await store.approval_rules(conn)
        return Reply.success({**page(rows, cmd.limit, _view, lambda item: item["approval_id"]),
                              "rules": [dict(r) for r in rules]})

    async def on_job_cancelled(self, event: CloudEvent, data: JobCancelled) -> None:
        """A job cancelled while awaiting approval needs no decision any more: withdraw its request (approving it
        later would otherwise look like it did something)."""
        async with self.rt.uow() as uow:
            if not await uow.first_time(CONSUMER, event.id):
                return
            row = await store.withdraw_approval(uow.conn, data.job_id, f"job cancelled: {data.reason}")
            if row is not None:
                await uow.emit(ApprovalWithdrawn(approval_id=row["approval_id"], job_id=row["job_id"],
                                                 team=row["team"], reason=row["comment"],
                                                 withdrawn_at=row["decided_at"]))

    async def list_teams(self, _: Empty) -> Reply:
        async with self.rt.pool.acquire() as conn:
            return Reply.success({"items": await store.list_teams(conn), "next": None})

    async def policy(self, _: Empty) -> Reply:
        """Everything placement needs to build its policy; it reconciles with this at start."""
        async with self.rt.pool.acquire() as conn:
            return Reply.success(await store.policy(conn))


def routes(h: QuotaHandlers) -> Routes:
    return Routes(
        commands={
            subjects.CMD_QUOTA_ADMIT: (AdmitJob, h.admit),
            subjects.CMD_QUOTA_CREATE_TEAM: (CreateTeam, h.create_team),
            subjects.CMD_QUOTA_SET_QUOTA: (SetQuota, h.set_quota),
            subjects.CMD_QUOTA_SET_PRIORITY_CLASS: (SetPriorityClass, h.set_priority_class),
            subjects.QUERY_QUOTA_LIST_TEAMS: (Empty, h.list_teams),
            subjects.QUERY_QUOTA_POLICY: (Empty, h.policy),
            subjects.CMD_QUOTA_SET_APPROVAL_RULE: (SetApprovalRule, h.set_approval_rule),
            subjects.CMD_QUOTA_DECIDE_APPROVAL: (DecideApproval, h.decide_approval),
            subjects.QUERY_QUOTA_APPROVALS: (ListApprovals, h.approvals),
        },
        events={JobCancelled: h.on_job_cancelled},
    )
