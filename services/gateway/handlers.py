"""The /v1 REST API. Reads and commands go to the owning services over NATS request/reply; the gateway holds no
copy of their data."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Header, Path, Query, Request, Response
from fastapi.security import HTTPBearer
from pydantic import BaseModel, Field, model_validator

from libs.bus.rpc import request
from libs.contracts import subjects
from libs.contracts.api import (
    CreatedToken,
    Explanation,
    Job,
    Pool,
    PoolFragmentation,
    SubmitResult,
    Token,
    WhoAmI,
)
from libs.contracts.api_pages import (
    AllocationPage,
    AuditPage,
    JobPage,
    NodePage,
    TeamList,
    TokenPage,
    TrackedList,
    UsagePage,
)
from libs.contracts.commands import (
    NAME_PATTERN,
    CancelJob,
    Command,
    Empty,
    GetPool,
    JobKind,
    JobRef,
    JobSpec,
    JobState,
    ListAllocations,
    ListApprovals,
    ListJobs,
    ListNodes,
    ListUsage,
    ScaleJob,
    SubmitJob,
    UpdateWork,
    page,
)
from libs.core import mig as migcat
from services.gateway import store
from services.gateway.auth import AuthError
from services.gateway.bodies import RequestBody
from services.gateway.domain import (
    ANY,
    TEAM_ADMIN_GRANTABLE,
    Action,
    Forbidden,
    Principal,
    Role,
    mint_token,
)
from services.gateway.pool import NODE_FACTS_EXAMPLE, NODE_TOTALS_EXAMPLE, combine_pool, with_host_reserved


class ApiError(Exception):
    def __init__(self, status: int, reason: str, detail: str, *, headers: dict[str, str] | None = None,
                 **extensions: Any) -> None:
        super().__init__(detail)
        self.status, self.reason, self.detail, self.extensions = status, reason, detail, extensions
        self.headers = headers


class JobRequestBody(RequestBody, JobSpec):
    """What a caller sends to submit a job: `gpus` on one node, a gang (`gang_nodes` × `gpus_per_node`, all or
    nothing), or `replicas` independent copies (an inference service; scale it later with PATCH). With `command`
    the agent of every granted node runs it (one process tree per allocation, logs at `/v1/jobs/{id}/logs`); the
    work fields (`env`, `workdir`, `limits`, `stop_signal`, `stop_grace_s`, `warn_before_s`, `warn_signal`,
    `restart`, `isolation`, `image`, `rootfs`) need a command. Without one the job only holds GPUs."""

    model_config = {"extra": "forbid", "json_schema_extra": {"examples": [
        {"name": "llama-finetune", "team": "research", "gpus": 2, "gpu_models": ["H100-80GB"],
         "kind": "training", "priority_class": "normal"},
        {"name": "pretrain", "team": "research", "gpus": 16, "gang_nodes": 2, "gpus_per_node": 8,
         "kind": "training"},
        {"name": "chat-api", "team": "inference", "gpus": 1, "replicas": 2, "kind": "inference",
         "priority_class": "production-inference"},
        {"name": "notebook", "team": "research", "gpus": 1, "kind": "dev", "gpu_fraction_milli": 250,
         "gpu_memory_mib": 12288},
        {"name": "embeddings", "team": "inference", "gpus": 1, "kind": "inference", "mig_profile": "3g.40gb",
         "gpu_models": ["A100-80GB"]},
        {"name": "resnet-train", "team": "research", "gpus": 1, "kind": "batch",
         "command": ["python", "train.py", "--epochs", "10"], "env": {"WANDB_MODE": "offline"},
         "workdir": "/scratch/resnet", "limits": {"memory_mib": 65536, "cpu_milli": 8000},
         "max_runtime_s": 7200, "warn_before_s": 300, "restart": {"policy": "on_failure", "attempts": 2,
                                                                  "delay_s": 30}}]}}

    name: str = Field(pattern=NAME_PATTERN, description="Lowercase name, 1–63 chars")
    team: str = Field(pattern=NAME_PATTERN)
    project: str = Field(default="default", pattern=NAME_PATTERN)
    kind: JobKind = "batch"
    priority_class: str = Field(default="normal", max_length=63)
    gpu_models: list[Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")]] = Field(
        default_factory=list, max_length=16, description="Any of these models; empty means any")

    @model_validator(mode="after")
    def _known_mig_profile(self) -> JobRequestBody:
        """A profile no (allowed) model has would wait forever: refuse it now, naming the ones that exist."""
        if self.mig_profile:
            models = self.gpu_models or list(migcat.CATALOGUE)
            known = sorted({p for m in models for p in migcat.profiles_for(m)})
            if self.mig_profile not in known:
                raise ValueError(f"no {'allowed ' if self.gpu_models else ''}GPU model has MIG profile "
                                 f"{self.mig_profile!r}; known: {', '.join(known) or 'none (no MIG-capable model)'}")
        return self

    @model_validator(mode="after")
    def _warning_within_runtime(self) -> JobRequestBody:
        """A warning before the declared limit needs the limit, and must come before it."""
        if self.warn_before_s is not None:
            if self.max_runtime_s is None:
                raise ValueError("warn_before_s needs max_runtime_s (the warning comes that long before it)")
            if self.warn_before_s >= self.max_runtime_s:
                raise ValueError("warn_before_s must be less than max_runtime_s")
        return self


class ScaleBody(RequestBody):
    """`replicas` scales; `command` and/or `env` update the work of a service, rolled out replica by replica (one
    extra replica first; each older one stopped only when the target count is ready without it)."""

    model_config = {"extra": "forbid", "json_schema_extra": {
        "examples": [{"replicas": 4}, {"command": ["python3", "serve.py", "--model", "v2"]}, {"env": {"MODEL": "v2"}}],
        # at least one of the three, not null: what `_something` refuses, said in the document
        "anyOf": [{"required": [name], "properties": {name: {"not": {"type": "null"}}}}
                  for name in ("replicas", "command", "env")]}}
    replicas: int | None = Field(default=None, ge=1, le=256)
    command: list[str] | None = Field(default=None, min_length=1, max_length=4096)
    env: dict[str, str] | None = Field(default=None, max_length=512)

    @model_validator(mode="after")
    def _something(self) -> ScaleBody:
        if self.replicas is None and self.command is None and self.env is None:
            raise ValueError("give replicas, command or env")
        return self


class CancelBody(RequestBody):
    model_config = {"extra": "forbid"}
    reason: str = Field(default="cancelled by user", max_length=500)


class BearerAuth(HTTPBearer):
    """The caller of every /v1 route, as one dependency that is also the OpenAPI `HTTPBearer` security scheme (a
    separate credentials dependency would cost a second dependency resolution on every request)."""

    async def __call__(self, request: Request) -> Principal:  # type: ignore[override]
        scheme, _, credentials = (request.headers.get("authorization") or "").partition(" ")
        credentials = credentials.strip()
        if scheme.lower() != "bearer" or not credentials:
            raise ApiError(401, "Unauthenticated", "send Authorization: Bearer <token>")
        try:
            principal = await request.app.state.authenticator.authenticate(credentials)
        except AuthError as exc:
            raise ApiError(401, exc.reason, str(exc)) from exc
        request.state.principal = principal
        return principal


authenticated = BearerAuth(scheme_name="HTTPBearer", auto_error=False)
Caller = Annotated[Principal, Depends(authenticated)]


def require(principal: Principal, action: Action, team: str | None = None) -> None:
    if not principal.may(action, team):
        raise ApiError(403, "Forbidden", str(Forbidden(principal, action, team)), action=action.value)


def team_filter(principal: Principal, action: Action, requested: str | None) -> str | None:
    """The team a list may show: a team-scoped caller sees only their own team."""
    if principal.scope(action) == ANY:
        return requested
    require(principal, action, requested or principal.team)
    return principal.team


async def record(req: Request, principal: Principal, action: str, target: str | None, before: Any = None,
                 after: Any = None, conn: Any = None) -> None:
    trace_id = req.headers.get("traceparent", "").split("-")[1] if req.headers.get("traceparent") else None
    kwargs = dict(actor=principal.subject, actor_role=principal.role, action=action, target=target,
                  before=before, after=after, trace_id=trace_id)
    if conn is not None:
        await store.audit(conn, **kwargs)
        return
    async with req.app.state.pool.acquire() as own:
        await store.audit(own, **kwargs)


async def call(req: Request, subject: str, cmd: Command) -> Any:
    reply = await request(req.app.state.nc, subject, cmd, timeout=req.app.state.settings.request_timeout_s)
    if not reply.ok:
        assert reply.error is not None
        raise ApiError(reply.error.status, reply.error.reason, reply.error.message, **reply.error.detail)
    return reply.result


class Problem(BaseModel):
    """RFC 9457 problem details, as every error of this API is answered."""

    type: str
    title: str
    status: int
    detail: str
    reason: str = Field(description="CamelCase machine reason, e.g. UnknownTeam, Forbidden, JobNotFound")
    instance: str | None = None
    model_config = {"extra": "allow"}


# one `Problem` component every error response refers to (the app's OpenAPI hook adds it): inlined per response,
# client generators made a duplicate model of it for every operation and status
_PROBLEM = {"application/problem+json": {"schema": {"$ref": "#/components/schemas/Problem"}}}
ERRORS: dict[int | str, dict[str, Any]] = {
    status: {"description": text, "content": _PROBLEM}
    for status, text in {
        400: "Malformed request (e.g. a body that is not JSON)",
        401: "Missing, invalid, expired or revoked bearer token",
        403: "The caller's role or team does not allow this",
        404: "No such resource",
        409: "The resource is not in a state that allows this",
        413: "Request body too large",
        422: "Validation failed, or the request is refused with a reason (e.g. UnknownTeam)",
        429: "Too many: the queue is full (QueueFull) or too many event streams; Retry-After says when to retry",
        503: "A backing service did not answer in time",
    }.items()
}

router = APIRouter(prefix="/v1", responses=ERRORS)


def refusals(rule: str, *reasons: str) -> dict[int | str, dict[str, Any]]:
    """The 422 of an operation whose schema-valid requests the server may still refuse, by a rule JSON Schema
    cannot say (across two fields or parameters, against the current time or what exists): `rule` in words, and
    the problem `reason`s it answers with in `x-refusal-reasons` (tests/e2e/test_api_fuzz.py holds a refused
    schema-valid request to exactly these)."""
    return {422: {"description": f"Refused: {rule} (reason {', '.join(reasons)}); or validation failed",
                  "content": _PROBLEM, "x-refusal-reasons": list(reasons)}}


def returns(model: type[BaseModel], status: int = 200, *, example: Any = None, description: str | None = None,
            more: dict[int | str, dict[str, Any]] | None = None) -> dict[str, Any]:
    """Route arguments that document the success body as `model` (one named component of the OpenAPI document,
    from libs/contracts/api*.py, the classes the typed client parses into) and send the route's dict as it is:
    FastAPI neither validates nor filters it (`response_model=None`), so a field the model does not name yet still
    reaches callers and a large list costs no second validation. The models allow extra fields and default what may
    be missing; tests/e2e/test_api_fuzz.py checks live responses against them."""
    response: dict[str, Any] = {"model": model}
    if description:
        response["description"] = description
    if example is not None:
        response["content"] = {"application/json": {"example": example}}
    return {"response_model": None, "responses": {status: response, **(more or {})}}


async def job_team(req: Request, job_id: str) -> dict:
    return await call(req, subjects.QUERY_QUEUE_GET_JOB, JobRef(job_id=job_id))


async def require_on_job(req: Request, caller: Principal, action: Action, job_id: str) -> None:
    """`require` for an action on an existing job. Only a team-scoped caller needs the job's team, which costs a
    query to the queue; for anyone allowed on every team the command itself answers 404 for an unknown job."""
    require(caller, action)
    if caller.scope(action) != ANY:
        require(caller, action, (await job_team(req, job_id))["team"])


@router.post("/jobs", status_code=201, summary="Submit a job", tags=["jobs"],
             **returns(SubmitResult, 201, description="Submitted (or held for approval: `approval_id`)",
                       more={200: {"model": SubmitResult, "description": "Replayed: same Idempotency-Key and body "
                                                                         "as an earlier submission"},
                             **refusals("the shape's rules across fields: a MIG slice or a GPU fraction needs "
                                        "`gpus: 1` and no gang, not both, not `exclusive`, a fraction needs "
                                        "`gpu_memory_mib`; a gang needs gpus == gang_nodes × gpus_per_node and no "
                                        "replicas; replica bounds; work fields need a `command`; autoscale on a "
                                        "metric needs a command and a port; a MIG profile some allowed model has; "
                                        "the team must exist", "InvalidRequest", "UnknownTeam",
                                        "UnknownPriorityClass")}))
async def submit_job(body: JobRequestBody, req: Request, response: Response, caller: Caller,
                     idempotency_key: Annotated[str | None, Header(max_length=255)] = None) -> dict:
    require(caller, Action.JOB_SUBMIT, body.team)
    result = await call(req, subjects.CMD_QUEUE_SUBMIT_JOB, SubmitJob(
        **body.model_dump(), idempotency_key=idempotency_key, idempotency_scope=caller.identity,
        submitted_by=caller.subject))
    created = result.pop("created", True)
    response.status_code = 201 if created else 200
    response.headers["Location"] = f"/v1/jobs/{result['job_id']}"
    return result


@router.get("/jobs", **returns(JobPage), summary="List jobs (cursor pagination)", tags=["jobs"])
async def list_jobs(req: Request, caller: Caller, team: str | None = None, state: JobState | None = None,
                    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
                    cursor: Annotated[str | None, Query(max_length=64)] = None) -> dict:
    team = team_filter(caller, Action.JOB_READ, team)
    return await call(req, subjects.QUERY_QUEUE_LIST_JOBS, ListJobs(team=team, state=state, limit=limit, after=cursor))


@router.get("/jobs/{job_id}", **returns(Job), summary="One job with its state history", tags=["jobs"])
async def get_job(job_id: Annotated[str, Path(max_length=64)], req: Request, caller: Caller) -> dict:
    require(caller, Action.JOB_READ)
    job = await job_team(req, job_id)
    require(caller, Action.JOB_READ, job["team"])
    return job


@router.get("/jobs/{job_id}/explain", **returns(Explanation), summary="Why a job is pending, running or being preempted", tags=["jobs"],
            description="The job's state from the queue and placement's view of it (`placement`): the reason code "
                        "and message of the last cycle, its position among pending jobs, and any preemption in "
                        "progress for it or against it. A pending job's `placement.facts` says the same as its "
                        "message, as data (`libs.contracts.reasons.PendingFacts`; fields at their defaults are "
                        "left out): `cause` (which sentence); the node census — `nodes_evaluated`, `filtered` "
                        "(nodes by filter that could never serve it: cordoned, node_selector, gpu_model, health, "
                        "sharing, host_size), `short` (the others by what they lack now: gpus, gpu_share, "
                        "mig_slice, cpu, memory, reserved, able) and `exhausted` (the resource most lack); "
                        "`quota` (the refusing entry: path, gpu_model, rule, used_gpus, asked_gpus, limit_gpus, "
                        "guaranteed_gpus); `victims_considered`, `victims` and `victim_nodes` (preemption), "
                        "`wait` (it waits instead of preempting: would_preempt, lost_gpu_hours, "
                        "waited_gpu_hours, max_wait_s); `domain_kind`, `domain`, `domain_nodes` (the rack a gang "
                        "waits for); `reservation_nodes`, `reservation_start` (UTC), `reservation_in_s`, "
                        "`soft_hold` (nodes held for it); `labels`, `holders`, `blocked_by`. Lists hold at most "
                        "32 names, with their full count beside them (`victim_count`, `reservation_node_count`).")
async def explain_job(job_id: Annotated[str, Path(max_length=64)], req: Request, caller: Caller) -> dict:
    """The job's state from the queue and placement's view of it, with the facts of its pending reason."""
    require(caller, Action.JOB_READ)
    job = await job_team(req, job_id)
    require(caller, Action.JOB_READ, job["team"])
    if job["state"] == "awaiting_approval":
        # placement has not seen it yet: the quota service knows what it waits for
        found = (await call(req, subjects.QUERY_QUOTA_APPROVALS, ListApprovals(job_id=job_id, limit=1)))["items"]
        approval = found[0] if found else None
        reasons = "; ".join(approval["reasons"]) if approval else "an approval rule"
        return {"job_id": job_id, "state": job["state"], "message": job.get("message"), "approval": approval,
                "placement": {"state": "awaiting_approval", "reason": "AwaitingApproval",
                              "message": f"held for approval ({reasons}); placement sees the job once it is approved"}}
    try:
        placement = await call(req, subjects.QUERY_PLACEMENT_EXPLAIN, JobRef(job_id=job_id))
    except ApiError as exc:
        if exc.status != 404:
            raise
        placement = {"state": "unknown", "reason": exc.reason, "message": exc.detail}
    return {"job_id": job_id, "state": job["state"], "message": job.get("message"), "placement": placement}


@router.patch("/jobs/{job_id}", **returns(Job), summary="Scale a service, or roll out its new command or env", tags=["jobs"],
              description="`replicas`: the new count (within min_replicas..max_replicas). `command` / `env`: the "
                          "service's new work (env replaces the whole environment), rolled out replica by replica "
                          "without dropping below its replicas ready (`409 NotRollable` for a single job, a gang, "
                          "or work without ports). Both: the work first, then the count.")
async def scale_job(job_id: Annotated[str, Path(max_length=64)], body: ScaleBody, req: Request,
                    caller: Caller) -> dict:
    await require_on_job(req, caller, Action.JOB_SUBMIT, job_id)
    result: dict = {}
    if body.command is not None or body.env is not None:
        result = await call(req, subjects.CMD_QUEUE_UPDATE_WORK, UpdateWork(
            job_id=job_id, command=body.command, env=body.env, updated_by=caller.subject))
    if body.replicas is not None:
        result = await call(req, subjects.CMD_QUEUE_SCALE_JOB, ScaleJob(job_id=job_id, replicas=body.replicas))
    return result


@router.post("/jobs/{job_id}/complete", **returns(Job), summary="Mark a running job completed (releases its GPUs)", tags=["jobs"])
async def complete_job(job_id: Annotated[str, Path(max_length=64)], req: Request, caller: Caller) -> dict:
    await require_on_job(req, caller, Action.JOB_COMPLETE, job_id)
    return await call(req, subjects.CMD_QUEUE_COMPLETE_JOB, JobRef(job_id=job_id))


@router.post("/jobs/{job_id}/cancel", **returns(Job), summary="Cancel a pending or running job", tags=["jobs"])
async def cancel_job(job_id: Annotated[str, Path(max_length=64)], req: Request, caller: Caller,
                     body: CancelBody | None = None) -> dict:
    require(caller, Action.JOB_CANCEL)
    before = await job_team(req, job_id)
    require(caller, Action.JOB_CANCEL, before["team"])
    reason = body.reason if body else "cancelled by user"
    after = await call(req, subjects.CMD_QUEUE_CANCEL_JOB, CancelJob(job_id=job_id, reason=reason))
    await record(req, caller, "job.cancel", job_id, {"state": before["state"]},
                 {"state": after["state"], "reason": reason})
    return after


@router.get("/nodes", summary="Nodes with their GPUs, health and latest telemetry", tags=["pool"],
            description="Each node carries its host facts: CPUs and memory (with the latest use), `network` (the "
                        "registered NICs, their summed link speed in Gbit/s, the latest rx/tx in Mbit/s) and "
                        "`storage` (the registered volumes, total and used GiB), and the host CPU "
                        "(`cpu_allocated_milli`) and memory (`memory_allocated_mib`) live allocations reserve there "
                        "(jobs' `cpu_milli` / `memory_mib`). Nodes registered by older agents show empty lists and "
                        "null numbers.",
            **returns(NodePage, example={"items": [
                {"cluster": "c1", "node": "node-a", "state": "ready", **NODE_FACTS_EXAMPLE,
                 "cpu_allocated_milli": 64000, "memory_allocated_mib": 524288, "gpus": []}], "next": None}))
async def list_nodes(req: Request, caller: Caller, cluster: Annotated[str | None, Query(max_length=63)] = None,
                     limit: Annotated[int, Query(ge=1, le=1000)] = 100,
                     cursor: Annotated[str | None, Query(max_length=300)] = None) -> dict:
    require(caller, Action.POOL_READ)
    page = await call(req, subjects.QUERY_INVENTORY_LIST_NODES, ListNodes(cluster=cluster, limit=limit, after=cursor))
    return {**page, "items": with_host_reserved(page["items"], await live_allocations(req))}


@router.get("/pool", summary="Per cluster and GPU model: total, allocated, in use, allocated-but-idle, free, "
            "unhealthy; per node CPU, memory, network and storage", tags=["pool"],
            description="`clusters[].nodes[]` carry each node's CPU, memory, `network` and `storage` facts (as "
                        "`/v1/nodes`) and the host CPU (`cpu_allocated_milli`) and memory (`memory_allocated_mib`) "
                        "live allocations reserve there (jobs' `cpu_milli` / `memory_mib`); `clusters[].node_totals` "
                        "and `all.node_totals` add up nodes, CPUs, memory, link speed (Gbit/s), storage (GiB) "
                        "and those reservations.",
            **returns(Pool, example={
                "clusters": [{"cluster": "c1", "models": [], "totals": {}, "node_totals": NODE_TOTALS_EXAMPLE,
                              "nodes": [{"node": "node-a", "state": "ready", "gpus": 8, **NODE_FACTS_EXAMPLE,
                                         "cpu_allocated_milli": 64000, "memory_allocated_mib": 524288}]}],
                "all": {"models": [], "totals": {}, "node_totals": NODE_TOTALS_EXAMPLE},
                "in_use_util_pct": 5.0, "fresh_within_s": 30.0}))
async def get_pool(req: Request, caller: Caller, cluster: Annotated[str | None, Query(max_length=63)] = None) -> dict:
    require(caller, Action.POOL_READ)
    inventory = await call(req, subjects.QUERY_INVENTORY_POOL, GetPool(cluster=cluster))
    return combine_pool(inventory, await live_allocations(req), cluster)


async def live_allocations(req: Request) -> list[dict]:
    """Every live allocation, as placement lists them (every page)."""
    allocations: list[dict] = []
    after: str | None = None
    while True:
        page = await call(req, subjects.QUERY_PLACEMENT_LIST_ALLOCATIONS,
                          ListAllocations(active=True, limit=1000, after=after))
        allocations += page["items"]
        if not (after := page["next"]):
            return allocations


@router.get("/pool/fragmentation", tags=["pool"],
            summary="Per cluster and GPU model: free GPU capacity that no recently asked-for job shape could use",
            **returns(PoolFragmentation, example={
                "measured_at": "2026-12-02T06:00:00+00:00", "window_s": 86400.0,
                "rows": [{"cluster": "c1", "gpu_model": "H100-80GB", "gpus": 16, "free_gpus": 7.0,
                          "fragmented_gpus": 3.5, "fragmented_share": 0.5}],
                "workload": [{"gpus": 8, "gpu_milli": 1000, "gpu_models": [], "share": 0.5},
                             {"gpus": 1, "gpu_milli": 1000, "gpu_models": [], "share": 0.5}]}))
async def get_fragmentation(req: Request, caller: Caller,
                            cluster: Annotated[str | None, Query(max_length=63)] = None) -> dict:
    """FGD's measure (Weng et al., ATC'23) on the live pool: of each cluster's and model's free GPU capacity, the
    part a job drawn from the recent workload could not use (too few wholly free GPUs on one node for its count,
    no shareable GPU with room for its fraction, no host CPU/memory left), the expectation over the workload's
    shapes. The workload is the shapes of the grants made within the window and of every waiting job, weighted
    by how often each occurred; `workload` lists them with their share."""
    require(caller, Action.POOL_READ)
    return await call(req, subjects.QUERY_PLACEMENT_FRAGMENTATION, GetPool(cluster=cluster))


@router.get("/allocations", **returns(AllocationPage), summary="Allocations (GPUs held by jobs)", tags=["pool"])
async def list_allocations(req: Request, caller: Caller, job_id: Annotated[str | None, Query(max_length=64)] = None,
                           active: bool | None = None, limit: Annotated[int, Query(ge=1, le=1000)] = 100,
                           cursor: Annotated[str | None, Query(max_length=64)] = None) -> dict:
    require(caller, Action.POOL_READ)
    return await call(req, subjects.QUERY_PLACEMENT_LIST_ALLOCATIONS,
                      ListAllocations(job_id=job_id, active=active, limit=limit, after=cursor))


@router.get("/usage", **returns(UsagePage), summary="GPU-seconds ledger", tags=["accounting"])
async def list_usage(req: Request, caller: Caller, team: Annotated[str | None, Query(max_length=63)] = None,
                     job_id: Annotated[str | None, Query(max_length=64)] = None,
                     limit: Annotated[int, Query(ge=1, le=1000)] = 100,
                     cursor: Annotated[str | None, Query(max_length=64)] = None) -> dict:
    team = team_filter(caller, Action.USAGE_READ, team)
    return await call(req, subjects.QUERY_ACCOUNTING_LIST_USAGE,
                      ListUsage(team=team, job_id=job_id, limit=limit, after=cursor))


@router.get("/teams", **returns(TeamList), summary="Teams and their quotas", tags=["quota"])
async def list_teams(req: Request, caller: Caller) -> dict:
    require(caller, Action.TEAM_READ)
    return await call(req, subjects.QUERY_QUOTA_LIST_TEAMS, Empty())


@router.get("/reclamation/tracked", **returns(TrackedList), summary="Live allocations with idle time from telemetry", tags=["reclaim"])
async def list_tracked(req: Request, caller: Caller) -> dict:
    require(caller, Action.POOL_READ)
    return await call(req, subjects.QUERY_RECLAMATION_LIST_TRACKED, Empty())


# --- tokens ----------------------------------------------------------------------------------------------------
class TokenRequest(RequestBody):
    model_config = {"extra": "forbid", "json_schema_extra": {"examples": [
        {"name": "alice-laptop", "role": "member", "team": "research", "expires_in_days": 90}]}}

    name: str = Field(pattern=NAME_PATTERN)
    role: Role
    team: str | None = Field(default=None, pattern=NAME_PATTERN)
    expires_in_days: int | None = Field(default=90, ge=1, le=3650, description="null: never expires")


def _token_view(row) -> Token:  # type: ignore[no-untyped-def]
    """A token as the API shows it (the client's model): its declared fields only, never the stored secret hash."""
    return Token(**{k: row[k] for k in Token.model_fields if k in row.keys()})  # noqa: SIM118 (asyncpg Record)


@router.post("/tokens", status_code=201, summary="Create an API token (the secret is shown once)", tags=["security"],
             response_model=CreatedToken, responses=refusals("a team-scoped role (team-admin, member, viewer, "
                                                             "service with a team) needs an existing `team`",
                                                             "TeamRequired", "UnknownTeam"))
async def create_token(body: TokenRequest, req: Request, caller: Caller) -> CreatedToken:
    require(caller, Action.TOKEN_MANAGE)
    if caller.scope(Action.TOKEN_MANAGE) != ANY:
        if body.team != caller.team or body.role not in TEAM_ADMIN_GRANTABLE:
            raise ApiError(403, "Forbidden", f"a team admin may grant only {sorted(TEAM_ADMIN_GRANTABLE)} "
                                             f"in team {caller.team!r}", action=Action.TOKEN_MANAGE.value)
    if body.role in ("team-admin", "member", "viewer") and body.team is None:
        raise ApiError(422, "TeamRequired", f"a {body.role} token must name its team")
    if body.team is not None:
        teams = (await call(req, subjects.QUERY_QUOTA_LIST_TEAMS, Empty()))["items"]
        if not any(t["team"] == body.team for t in teams):
            raise ApiError(422, "UnknownTeam", f"team {body.team!r} does not exist", team=body.team)
    token_id, token, secret_hash = mint_token()
    expires = datetime.now(UTC) + timedelta(days=body.expires_in_days) if body.expires_in_days else None
    async with req.app.state.pool.acquire() as conn, conn.transaction():
        row = await store.insert_token(conn, token_id=token_id, name=body.name, role=body.role, team=body.team,
                                       secret_hash=secret_hash, created_by=caller.subject, expires_at=expires)
        view = _token_view(row)
        await record(req, caller, "token.create", token_id, None, view.model_dump(mode="json"), conn=conn)
    return CreatedToken(**view.model_dump(), token=token)


@router.get("/tokens", **returns(TokenPage), summary="List API tokens (never their secrets)", tags=["security"])
async def list_tokens(req: Request, caller: Caller, limit: Annotated[int, Query(ge=1, le=1000)] = 100,
                      cursor: Annotated[str | None, Query(max_length=64)] = None) -> dict:
    require(caller, Action.TOKEN_MANAGE)
    team = None if caller.scope(Action.TOKEN_MANAGE) == ANY else caller.team
    async with req.app.state.pool.acquire() as conn:
        rows = await store.list_tokens(conn, team=team, limit=limit + 1, after=cursor)
    return page(rows, limit, lambda r: _token_view(r).model_dump(mode="json"), lambda t: t["token_id"])


@router.delete("/tokens/{token_id}", status_code=204, summary="Revoke an API token", tags=["security"])
async def revoke_token(token_id: Annotated[str, Path(max_length=64)], req: Request, caller: Caller) -> Response:
    require(caller, Action.TOKEN_MANAGE)
    async with req.app.state.pool.acquire() as conn, conn.transaction():
        row = await store.find_token(conn, token_id)
        if row is None or (caller.scope(Action.TOKEN_MANAGE) != ANY and row["team"] != caller.team):
            raise ApiError(404, "TokenNotFound", f"no token {token_id}")
        revoked = await store.revoke_token(conn, token_id)
        await record(req, caller, "token.revoke", token_id, {"revoked_at": None},
                     {"revoked_at": revoked["revoked_at"].isoformat()}, conn=conn)
    req.app.state.authenticator.forget(token_id)  # at once here; other replicas on PostgreSQL's announcement
    return Response(status_code=204)


@router.get("/audit", **returns(AuditPage), summary="Audit log of administrative actions (newest first)", tags=["security"])
async def list_audit(req: Request, caller: Caller, action: Annotated[str | None, Query(max_length=64)] = None,
                     limit: Annotated[int, Query(ge=1, le=1000)] = 100,
                     cursor: Annotated[int | None, Query(ge=1, le=2**63 - 1)] = None) -> dict:
    require(caller, Action.AUDIT_READ)
    async with req.app.state.pool.acquire() as conn:
        rows = await store.list_audit(conn, action=action, limit=limit + 1, before_id=cursor)
    return page(rows, limit, lambda r: {
        "id": r["id"], "at": r["at"].isoformat(), "actor": r["actor"], "actor_role": r["actor_role"],
        "action": r["action"], "target": r["target"], "before": json.loads(r["before"]) if r["before"] else None,
        "after": json.loads(r["after"]) if r["after"] else None, "trace_id": r["trace_id"]}, lambda e: e["id"])


@router.get("/whoami", **returns(WhoAmI), summary="The authenticated caller: subject, role, team", tags=["security"])
async def whoami(caller: Caller) -> dict:
    return {"subject": caller.subject, "role": caller.role, "team": caller.team, "via": caller.via,
            "allowed": sorted(a.value for a in Action if caller.scope(a))}
