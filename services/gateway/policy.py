"""Teams, quotas and priority classes: read by everyone, changed only by platform admins, every change audited.

The quota service owns all of it; these routes are request/reply to it plus an audit entry with before/after.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query, Request
from pydantic import Field

from libs.contracts import subjects
from libs.contracts.api import Approval, PriorityClass, QuotaEntry, ReclaimPolicy
from libs.contracts.api import ApprovalRule as ApprovalRuleView
from libs.contracts.api_pages import (
    ApprovalPage,
    PriorityClassList,
    QuotaEntryList,
    QuotaLoanList,
    ReclaimPolicyList,
    TeamCreated,
)
from libs.contracts.commands import (
    LOAN_PATH_PATTERN,
    MODEL_PATTERN,
    NAME_PATTERN,
    QUOTA_PATH_PATTERN,
    ApprovalRule,
    CreateTeam,
    DecideApproval,
    Empty,
    JobKind,
    ListApprovals,
    ListQuotaLoans,
    RequestQuotaLoan,
    SetApprovalRule,
    SetPriorityClass,
    SetQuota,
    SetReclaimPolicy,
)
from services.gateway.bodies import Instant, RequestBody
from services.gateway.domain import Action
from services.gateway.handlers import (
    ERRORS,
    ApiError,
    Caller,
    call,
    record,
    refusals,
    require,
    returns,
    team_filter,
)

router = APIRouter(prefix="/v1", responses=ERRORS)


class TeamBody(RequestBody):
    model_config = {"extra": "forbid", "json_schema_extra": {"examples": [{"team": "vision", "org": "research"}]}}

    team: str = Field(pattern=NAME_PATTERN)
    org: str = Field(default="default", pattern=NAME_PATTERN)


class QuotaBody(RequestBody):
    """One entry of the org → team → project quota tree, in GPUs (fractions allowed)."""

    model_config = {"extra": "forbid", "json_schema_extra": {"examples": [
        {"path": "default/research", "gpu_model": "H100-80GB", "guaranteed": 16, "borrowing_limit": 8,
         "lending_limit": 8, "weight": 1.0}]}}

    path: str = Field(pattern=QUOTA_PATH_PATTERN, description="org, org/team or org/team/project")
    gpu_model: str = Field(default="*", pattern=MODEL_PATTERN, description="'*' for any model")
    guaranteed: float = Field(default=0.0, ge=0, le=1_000_000)
    borrowing_limit: float | None = Field(default=None, ge=0, le=1_000_000, description="null: unlimited")
    lending_limit: float | None = Field(default=None, ge=0, le=1_000_000, description="null: lend all unused")
    weight: float = Field(default=1.0, gt=0, le=1000, description="over-quota fair-share weight")


class PriorityClassBody(RequestBody):
    model_config = {"extra": "forbid", "json_schema_extra": {"examples": [
        {"value": 500, "preemptible": True, "min_runtime_s": 300, "description": "nightly evaluations"}]}}

    value: int = Field(ge=-1_000_000, le=1_000_000, description="higher runs first")
    preemptible: bool
    min_runtime_s: float | None = Field(default=None, ge=0, le=30 * 24 * 3600)
    description: str = Field(default="", max_length=500)


@router.post("/teams", **returns(TeamCreated, 201), status_code=201, summary="Create a team (and its org)", tags=["quota"])
async def create_team(body: TeamBody, req: Request, caller: Caller) -> dict:
    require(caller, Action.QUOTA_MANAGE)
    result = await call(req, subjects.CMD_QUOTA_CREATE_TEAM, CreateTeam(team=body.team, org=body.org))
    if result.pop("created", False):
        await record(req, caller, "team.create", body.team, None, {"team": body.team, "org": body.org})
    return result


@router.get("/quotas", **returns(QuotaEntryList), summary="Every quota entry of the org → team → project tree", tags=["quota"])
async def list_quotas(req: Request, caller: Caller) -> dict:
    require(caller, Action.TEAM_READ)
    policy = await call(req, subjects.QUERY_QUOTA_POLICY, Empty())
    return {"items": policy["quotas"], "next": None}


@router.put("/quotas", **returns(QuotaEntry, more=refusals(
    "a lending limit above the guarantee; the path's org and team must exist", "InvalidQuota", "UnknownOrg",
    "UnknownTeam")), summary="Set one quota entry (created if missing)", tags=["quota"])
async def set_quota(body: QuotaBody, req: Request, caller: Caller) -> dict:
    require(caller, Action.QUOTA_MANAGE)
    result = await call(req, subjects.CMD_QUOTA_SET_QUOTA, SetQuota(**body.model_dump()))
    await record(req, caller, "quota.set", f"{body.path}:{body.gpu_model}", result["before"], result["after"])
    return result["after"]


@router.delete("/quotas", status_code=204, summary="Remove one quota entry", tags=["quota"])
async def delete_quota(req: Request, caller: Caller,
                       path: Annotated[str, Query(pattern=QUOTA_PATH_PATTERN)],
                       gpu_model: Annotated[str, Query(pattern=MODEL_PATTERN)] = "*") -> None:
    require(caller, Action.QUOTA_MANAGE)
    result = await call(req, subjects.CMD_QUOTA_SET_QUOTA, SetQuota(path=path, gpu_model=gpu_model, delete=True))
    await record(req, caller, "quota.delete", f"{path}:{gpu_model}", result["before"], None)


@router.get("/priority-classes", **returns(PriorityClassList), summary="Priority classes (higher value runs first)", tags=["quota"])
async def list_priority_classes(req: Request, caller: Caller) -> dict:
    require(caller, Action.TEAM_READ)
    policy = await call(req, subjects.QUERY_QUOTA_POLICY, Empty())
    return {"items": policy["priority_classes"], "next": None}


@router.put("/priority-classes/{name}", **returns(PriorityClass), summary="Create or change a priority class", tags=["quota"])
async def set_priority_class(name: Annotated[str, Path(pattern=NAME_PATTERN)], body: PriorityClassBody,
                             req: Request, caller: Caller) -> dict:
    require(caller, Action.QUOTA_MANAGE)
    result = await call(req, subjects.CMD_QUOTA_SET_PRIORITY_CLASS, SetPriorityClass(name=name, **body.model_dump()))
    await record(req, caller, "priority_class.set", name, result["before"], result["after"])
    return result["after"]


# --- approvals ----------------------------------------------------------------------------------------------------
class DecisionBody(RequestBody):
    model_config = {"extra": "forbid", "json_schema_extra": {"examples": [{"comment": "ok for this sprint"}]}}
    comment: str = Field(default="", max_length=1000)


class RuleBody(RequestBody):
    model_config = {"extra": "forbid", "json_schema_extra": {"examples": [{"value": "32", "enabled": True}]}}
    value: str = Field(min_length=1, max_length=63, description="GPUs, seconds, or a priority class name")
    enabled: bool = True


@router.get("/approvals", **returns(ApprovalPage), summary="Approval requests (team-scoped callers see their team's)", tags=["approvals"])
async def list_approvals(req: Request, caller: Caller, team: Annotated[str | None, Query(max_length=63)] = None,
                         state: Annotated[str | None, Query(pattern="^(pending|approved|denied|withdrawn)$")] = None,
                         kind: Annotated[str | None, Query(pattern="^(job|loan)$")] = None,
                         job_id: Annotated[str | None, Query(max_length=64)] = None,
                         limit: Annotated[int, Query(ge=1, le=1000)] = 100,
                         cursor: Annotated[str | None, Query(max_length=64)] = None) -> dict:
    """Newest first, `next` is the cursor of the following page. `withdrawn`: the job was cancelled before anyone
    decided."""
    team = team_filter(caller, Action.JOB_READ, team)
    return await call(req, subjects.QUERY_QUOTA_APPROVALS, ListApprovals(team=team, state=state, job_id=job_id,
                                                                       kind=kind, limit=limit, before=cursor))


async def _decide(req: Request, caller, approval_id: str, approve: bool, body: DecisionBody | None) -> dict:  # type: ignore[no-untyped-def]
    require(caller, Action.APPROVAL_DECIDE)
    found = (await call(req, subjects.QUERY_QUOTA_APPROVALS, ListApprovals(approval_id=approval_id)))["items"]
    if not found:
        raise ApiError(404, "ApprovalNotFound", f"no approval request {approval_id}")
    require(caller, Action.APPROVAL_DECIDE, found[0]["team"])
    if found[0].get("kind") == "loan":  # lending guarantee changes the quota tree: platform admins only
        require(caller, Action.QUOTA_MANAGE)
    comment = body.comment if body else ""
    decided = await call(req, subjects.CMD_QUOTA_DECIDE_APPROVAL, DecideApproval(
        approval_id=approval_id, approve=approve, comment=comment, decided_by=caller.subject))
    await record(req, caller, "approval.approve" if approve else "approval.deny", approval_id,
                 {"state": "pending"}, {"state": decided["state"], "job_id": decided["job_id"], "comment": comment})
    return decided


@router.post("/approvals/{approval_id}/approve", **returns(Approval), summary="Approve: the job joins the queue", tags=["approvals"])
async def approve(approval_id: Annotated[str, Path(max_length=64)], req: Request, caller: Caller,
                  body: DecisionBody | None = None) -> dict:
    return await _decide(req, caller, approval_id, True, body)


@router.post("/approvals/{approval_id}/deny", **returns(Approval), summary="Deny: the job fails with ApprovalDenied", tags=["approvals"])
async def deny(approval_id: Annotated[str, Path(max_length=64)], req: Request, caller: Caller,
               body: DecisionBody | None = None) -> dict:
    return await _decide(req, caller, approval_id, False, body)


class LoanBody(RequestBody):
    """Extra guarantee for one entry of the quota tree until a date; a platform admin approves or denies it."""

    model_config = {"extra": "forbid", "json_schema_extra": {"examples": [
        {"path": "default/research", "gpu_model": "H100-80GB", "gpus": 8, "until": "2026-12-24T00:00:00Z",
         "reason": "paper deadline"}]}}

    path: str = Field(pattern=LOAN_PATH_PATTERN, description="org/team or org/team/project")
    gpu_model: str = Field(default="*", pattern=MODEL_PATTERN)
    gpus: int = Field(ge=1, le=100_000)
    until: Instant = Field(description="when the loan ends (at most 90 days ahead); with a time zone")
    reason: str = Field(min_length=1, max_length=500)


@router.post("/quota-loans", **returns(Approval, 201, more=refusals(
    "`until` in the future and at most 90 days ahead; `path` an existing team", "InvalidLoan", "UnknownTeam")), status_code=201, summary="Ask for a time-boxed quota loan (goes to approval)",
             tags=["approvals"])
async def request_loan(body: LoanBody, req: Request, caller: Caller) -> dict:
    """Team admins ask for their own team; the request appears in `GET /v1/approvals` (kind `loan`) and only a
    platform admin may approve it. While approved and not over, the entry's effective guarantee includes it."""
    parts = body.path.split("/")
    require(caller, Action.QUOTA_LOAN_REQUEST, parts[1] if len(parts) > 1 else None)
    result = await call(req, subjects.CMD_QUOTA_REQUEST_LOAN, RequestQuotaLoan(
        path=body.path, gpu_model=body.gpu_model, gpus=body.gpus, until=body.until, reason=body.reason,
        requested_by=caller.subject))
    await record(req, caller, "quota_loan.request", result["approval_id"], None, result)
    return result


@router.get("/quota-loans", **returns(QuotaLoanList), summary="Quota loans granted (active ones, or all)", tags=["approvals"])
async def list_loans(req: Request, caller: Caller, active: bool = False) -> dict:
    require(caller, Action.TEAM_READ)
    return await call(req, subjects.QUERY_QUOTA_LOANS, ListQuotaLoans(active_only=active))


@router.put("/approval-rules/{rule}", **returns(ApprovalRuleView, more=refusals(
    "`value` of the rule's kind: a number of GPUs or seconds, or an existing priority class", "InvalidRule")), summary="Set an admission rule that requires approval", tags=["approvals"])
async def set_approval_rule(rule: ApprovalRule, body: RuleBody, req: Request, caller: Caller) -> dict:
    require(caller, Action.QUOTA_MANAGE)
    result = await call(req, subjects.CMD_QUOTA_SET_APPROVAL_RULE,
                        SetApprovalRule(rule=rule, value=body.value, enabled=body.enabled))
    await record(req, caller, "approval_rule.set", rule, None, result)
    return result


# --- reclamation policies -----------------------------------------------------------------------------------------
class ReclaimPolicyBody(RequestBody):
    model_config = {"extra": "forbid", "json_schema_extra": {"examples": [
        {"idle_after_s": 1800, "idle_util_pct": 5, "grace_s": 300, "enforce_max_runtime": True}]}}

    idle_after_s: float | None = Field(default=None, ge=1, le=30 * 24 * 3600, description="null: never idle-reclaim")
    idle_util_pct: float = Field(default=5.0, ge=0, le=100)
    grace_s: float = Field(default=300.0, ge=0, le=7 * 24 * 3600)
    enforce_max_runtime: bool = True


@router.get("/reclaim-policies", **returns(ReclaimPolicyList), summary="What is taken back, per job kind", tags=["reclaim"])
async def list_reclaim_policies(req: Request, caller: Caller) -> dict:
    require(caller, Action.TEAM_READ)
    return await call(req, subjects.QUERY_RECLAMATION_POLICIES, Empty())


@router.put("/reclaim-policies/{kind}", **returns(ReclaimPolicy), summary="Set the reclaim policy of a job kind", tags=["reclaim"])
async def set_reclaim_policy(kind: JobKind, body: ReclaimPolicyBody, req: Request, caller: Caller) -> dict:
    require(caller, Action.QUOTA_MANAGE)
    result = await call(req, subjects.CMD_RECLAMATION_SET_POLICY, SetReclaimPolicy(kind=kind, **body.model_dump()))
    await record(req, caller, "reclaim_policy.set", kind, result["before"], result["after"])
    return result["after"]
