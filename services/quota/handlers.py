"""Quota service: owns the org → team → project tree, quotas on every level, priority classes, and admission.

Every change is written with its event (outbox) carrying the row's full new state and a revision, so placement's
read model converges whatever order it sees changes in.
"""

from __future__ import annotations

import asyncio
import logging

from libs.contracts import subjects
from libs.contracts.commands import (
    AdmitJob,
    CreateTeam,
    DecideApproval,
    Empty,
    ListApprovals,
    ListQuotaLoans,
    Reply,
    RequestQuotaLoan,
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
from libs.domain import Refusal
from libs.runtime.routes import Routes, once
from libs.runtime.service import ServiceRuntime
from services.quota import store
from services.quota.domain import (
    admit,
    approval_reasons,
    decision_refusal,
    loan_refusal,
    loan_team_refusal,
    quota_limits_refusal,
    quota_path_error,
    rule_value_error,
    team_exists_refusal,
)

CONSUMER = "quota"
MAX_LOAN_DAYS = 90
log = logging.getLogger(__name__)


def _quota_event(row, *, deleted: bool = False, revision: int | None = None) -> QuotaSet:  # type: ignore[no-untyped-def]
    """The entry as read models must hold it: `guaranteed` is the effective one (own + active loans)."""
    loaned = row["loaned"] if "loaned" in row.keys() else 0.0  # noqa: SIM118 (asyncpg Record)
    return QuotaSet(path=row["path"], gpu_model=row["gpu_model"], guaranteed=row["guaranteed"],
                    borrowing_limit=row["borrowing_limit"], lending_limit=row["lending_limit"], weight=row["weight"],
                    deleted=deleted, revision=revision or row["revision"], set_at=utcnow(), loaned=loaned)


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
                if (refused := team_exists_refusal(cmd.team, cmd.org, existing)) is not None:
                    return Reply.refused(refused)
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
            if (refused := quota_limits_refusal(cmd.guaranteed, cmd.lending_limit)) is not None:
                return Reply.refused(refused)
            parts = cmd.path.split("/")
            refused = quota_path_error(
                cmd.path, org_known=await store.org_exists(uow.conn, parts[0]),
                team=await store.get_team(uow.conn, parts[1]) if len(parts) > 1 else None)
            if refused is not None:
                return Reply.refused(refused)
            await store.upsert_quota(uow.conn, cmd)
            row = await store.get_quota(uow.conn, cmd.path, cmd.gpu_model)  # effective: own + active loans
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
            inputs = await store.admission_inputs(conn, cmd.team, cmd.priority_class)
        admitted = admit(cmd, team=inputs["team"], priority_class=inputs["priority_class"],
                         quota_entries=inputs["entries"])
        if isinstance(admitted, Refusal):
            return Reply.refused(admitted)
        if cmd.job_id is None:
            return Reply.success(admitted)
        reasons = approval_reasons(cmd, inputs["rules"])
        if not reasons:
            return Reply.success(admitted)
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
        return Reply.success({**admitted, "approval_required": True, "approval_id": row["approval_id"],
                              "approval_reasons": reasons})

    async def set_approval_rule(self, cmd: SetApprovalRule) -> Reply:
        if (why := rule_value_error(cmd.rule, cmd.value)) is not None:
            return Reply.failure(422, "InvalidRule", why)
        async with self.rt.pool.acquire() as conn:
            return Reply.success(dict(await store.set_approval_rule(conn, cmd.rule, cmd.value, cmd.enabled)))

    async def decide_approval(self, cmd: DecideApproval) -> Reply:
        async with self.rt.uow() as uow:
            now = utcnow()
            request = await store.get_approval(uow.conn, cmd.approval_id)
            if (refused := decision_refusal(cmd.approval_id, request, cmd.approve, now)) is not None:
                return Reply.refused(refused)
            row = await store.decide_approval(uow.conn, cmd.approval_id, cmd.approve, cmd.comment, cmd.decided_by)
            if row is None:  # decided by someone else in between
                request = await store.get_approval(uow.conn, cmd.approval_id)
                return Reply.refused(decision_refusal(cmd.approval_id, request, cmd.approve, now))
            if row["kind"] == "loan" and cmd.approve:
                await store.grant_loan(uow.conn, row, cmd.decided_by)
                entry = await store.get_quota(uow.conn, row["loan_path"], row["loan_gpu_model"])
                await uow.emit(_quota_event(entry))
            await uow.emit(ApprovalDecided(approval_id=row["approval_id"], job_id=row["job_id"] or "",
                                           team=row["team"], approved=cmd.approve, comment=cmd.comment,
                                           decided_by=cmd.decided_by, decided_at=row["decided_at"],
                                           kind=row["kind"]))
        return Reply.success(_view(row))

    async def request_loan(self, cmd: RequestQuotaLoan) -> Reply:
        """A time-boxed quota loan goes through the approval flow: recorded here, decided by a platform admin."""
        if (refused := loan_refusal(cmd.path, cmd.until, utcnow(), MAX_LOAN_DAYS)) is not None:
            return Reply.refused(refused)
        parts = cmd.path.split("/")
        async with self.rt.uow() as uow:
            team = await store.get_team(uow.conn, parts[1])
            if (refused := loan_team_refusal(cmd.path, team)) is not None:
                return Reply.refused(refused)
            reason = f"loan of {cmd.gpus} {cmd.gpu_model} GPU(s) to {cmd.path} until {cmd.until.isoformat()}: " \
                     f"{cmd.reason}"
            row = await store.insert_loan_request(
                uow.conn, approval_id=uuid7(), job_name=f"quota loan for {cmd.path}", team=parts[1],
                project=parts[2] if len(parts) > 2 else "default", gpus=cmd.gpus, reasons=[reason],
                requested_by=cmd.requested_by, path=cmd.path, gpu_model=cmd.gpu_model, until=cmd.until)
            await uow.emit(ApprovalRequested(
                approval_id=row["approval_id"], job_id="", job_name=row["job_name"], team=row["team"],
                project=row["project"], gpus=row["gpus"], priority_class="", reasons=list(row["reasons"]),
                requested_by=row["requested_by"], requested_at=row["created_at"], kind="loan",
                loan_path=cmd.path, loan_gpu_model=cmd.gpu_model, loan_until=cmd.until))
        return Reply.success(_view(row))

    async def loans(self, cmd: ListQuotaLoans) -> Reply:
        async with self.rt.pool.acquire() as conn:
            rows = await store.list_loans(conn, active_only=cmd.active_only)
        return Reply.success({"items": [_view(r) for r in rows], "next": None})

    async def expire_loans(self) -> int:
        """End the loans whose date passed: the entry's effective guarantee drops back, announced as QuotaSet."""
        async with self.rt.uow() as uow:
            ended = await store.expire_loans(uow.conn)
            for path, model in sorted({(r["path"], r["gpu_model"]) for r in ended}):
                await store.touch_entry(uow.conn, path, model)
                await uow.emit(_quota_event(await store.get_quota(uow.conn, path, model)))
        for r in ended:
            log.info("quota_loan_expired", extra={"loan_id": r["loan_id"], "path": r["path"]})
        return len(ended)

    async def sweep_loans(self, interval_s: float) -> None:
        while True:
            await asyncio.sleep(interval_s)
            try:
                await self.expire_loans()
            except Exception as exc:  # the database is away: next round
                log.warning("loan_sweep_failed", extra={"error": repr(exc)})

    async def approvals(self, cmd: ListApprovals) -> Reply:
        async with self.rt.pool.acquire() as conn:
            rows = await store.list_approvals(conn, team=cmd.team, state=cmd.state, approval_id=cmd.approval_id,
                                              job_id=cmd.job_id, limit=cmd.limit + 1, before=cmd.before,
                                              kind=cmd.kind)
            rules = await store.approval_rules(conn)
        return Reply.success({**page(rows, cmd.limit, _view, lambda item: item["approval_id"]),
                              "rules": [dict(r) for r in rules]})

    async def on_job_cancelled(self, event: CloudEvent, data: JobCancelled) -> None:
        """A job cancelled while awaiting approval needs no decision any more: withdraw its request (approving it
        later would otherwise look like it did something)."""
        async with self.rt.uow() as uow:
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
        inbox=CONSUMER,
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
            subjects.CMD_QUOTA_REQUEST_LOAN: (RequestQuotaLoan, h.request_loan),
            subjects.QUERY_QUOTA_LOANS: (ListQuotaLoans, h.loans),
        },
        events={JobCancelled: once(h.on_job_cancelled)},
        batched=True,  # its one event handler is a single unit of work (README: "Batched event handling")
    )
