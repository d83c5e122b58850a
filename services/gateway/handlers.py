"""The /v1 REST API. Reads and commands go to the owning services over NATS request/reply; the gateway holds no
copy of their data."""

from __future__ import annotations

import hmac
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Header, Query, Request, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel, Field

from libs.bus.rpc import request
from libs.contracts import subjects
from libs.contracts.commands import (
    NAME_PATTERN,
    CancelJob,
    Command,
    Empty,
    JobKind,
    JobRef,
    JobState,
    ListAllocations,
    ListJobs,
    ListNodes,
    ListUsage,
    SubmitJob,
)


class ApiError(Exception):
    def __init__(self, status: int, reason: str, detail: str, **extensions: Any) -> None:
        super().__init__(detail)
        self.status, self.reason, self.detail, self.extensions = status, reason, detail, extensions


class JobRequestBody(BaseModel):
    """What a caller sends to submit a job."""

    model_config = {"extra": "forbid", "json_schema_extra": {"examples": [
        {"name": "llama-finetune", "team": "research", "gpus": 2, "gpu_models": ["H100-80GB"],
         "kind": "training", "priority_class": "normal"}]}}

    name: str = Field(pattern=NAME_PATTERN, description="Lowercase name, 1–63 chars")
    team: str = Field(pattern=NAME_PATTERN)
    project: str = Field(default="default", pattern=NAME_PATTERN)
    kind: JobKind = "batch"
    priority_class: str = Field(default="normal", max_length=63)
    gpus: int = Field(ge=1, le=4096, description="Whole GPUs, all on one node")
    gpu_models: list[Annotated[str, Field(max_length=64)]] = Field(
        default_factory=list, max_length=16, description="Any of these models; empty means any")


class CancelBody(BaseModel):
    model_config = {"extra": "forbid"}
    reason: str = Field(default="cancelled by user", max_length=500)


bearer = HTTPBearer(auto_error=False)


def authenticated(request: Request,
                  creds: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]) -> str:
    expected = request.app.state.settings.admin_token
    if creds is None or creds.scheme.lower() != "bearer":
        raise ApiError(401, "Unauthenticated", "send Authorization: Bearer <token>")
    if not expected or not hmac.compare_digest(creds.credentials.encode(), expected.encode()):
        raise ApiError(401, "InvalidToken", "the bearer token is not valid")
    return "admin"


Principal = Annotated[str, Depends(authenticated)]


async def call(req: Request, subject: str, cmd: Command) -> Any:
    reply = await request(req.app.state.nc, subject, cmd, timeout=req.app.state.settings.request_timeout_s)
    if not reply.ok:
        assert reply.error is not None
        raise ApiError(reply.error.status, reply.error.reason, reply.error.message, **reply.error.detail)
    return reply.result


router = APIRouter(prefix="/v1")


@router.post("/jobs", status_code=201, summary="Submit a job", tags=["jobs"],
             responses={200: {"description": "Replayed: same Idempotency-Key and body as an earlier submission"}})
async def submit_job(body: JobRequestBody, req: Request, response: Response, principal: Principal,
                     idempotency_key: Annotated[str | None, Header(max_length=255)] = None) -> dict:
    result = await call(req, subjects.CMD_QUEUE_SUBMIT_JOB, SubmitJob(
        **body.model_dump(), idempotency_key=idempotency_key, submitted_by=principal))
    created = result.pop("created", True)
    response.status_code = 201 if created else 200
    response.headers["Location"] = f"/v1/jobs/{result['job_id']}"
    return result


@router.get("/jobs", summary="List jobs (cursor pagination)", tags=["jobs"])
async def list_jobs(req: Request, _: Principal, team: str | None = None, state: JobState | None = None,
                    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
                    cursor: Annotated[str | None, Query(max_length=64)] = None) -> dict:
    return await call(req, subjects.QUERY_QUEUE_LIST_JOBS, ListJobs(team=team, state=state, limit=limit, after=cursor))


@router.get("/jobs/{job_id}", summary="One job with its state history", tags=["jobs"])
async def get_job(job_id: str, req: Request, _: Principal) -> dict:
    return await call(req, subjects.QUERY_QUEUE_GET_JOB, JobRef(job_id=job_id))


@router.post("/jobs/{job_id}/complete", summary="Mark a running job completed (releases its GPUs)", tags=["jobs"])
async def complete_job(job_id: str, req: Request, _: Principal) -> dict:
    return await call(req, subjects.CMD_QUEUE_COMPLETE_JOB, JobRef(job_id=job_id))


@router.post("/jobs/{job_id}/cancel", summary="Cancel a pending or running job", tags=["jobs"])
async def cancel_job(job_id: str, req: Request, _: Principal, body: CancelBody | None = None) -> dict:
    reason = body.reason if body else "cancelled by user"
    return await call(req, subjects.CMD_QUEUE_CANCEL_JOB, CancelJob(job_id=job_id, reason=reason))


@router.get("/nodes", summary="Nodes with their GPUs, health and latest telemetry", tags=["pool"])
async def list_nodes(req: Request, _: Principal, cluster: str | None = None,
                     limit: Annotated[int, Query(ge=1, le=1000)] = 100,
                     cursor: Annotated[str | None, Query(max_length=300)] = None) -> dict:
    return await call(req, subjects.QUERY_INVENTORY_LIST_NODES, ListNodes(cluster=cluster, limit=limit, after=cursor))


@router.get("/allocations", summary="Allocations (GPUs held by jobs)", tags=["pool"])
async def list_allocations(req: Request, _: Principal, job_id: str | None = None, active: bool | None = None,
                           limit: Annotated[int, Query(ge=1, le=1000)] = 100,
                           cursor: Annotated[str | None, Query(max_length=64)] = None) -> dict:
    return await call(req, subjects.QUERY_PLACEMENT_LIST_ALLOCATIONS,
                      ListAllocations(job_id=job_id, active=active, limit=limit, after=cursor))


@router.get("/usage", summary="GPU-seconds ledger", tags=["accounting"])
async def list_usage(req: Request, _: Principal, team: str | None = None, job_id: str | None = None,
                     limit: Annotated[int, Query(ge=1, le=1000)] = 100,
                     cursor: Annotated[str | None, Query(max_length=64)] = None) -> dict:
    return await call(req, subjects.QUERY_ACCOUNTING_LIST_USAGE,
                      ListUsage(team=team, job_id=job_id, limit=limit, after=cursor))


@router.get("/teams", summary="Teams and their quotas", tags=["quota"])
async def list_teams(req: Request, _: Principal) -> dict:
    return await call(req, subjects.QUERY_QUOTA_LIST_TEAMS, Empty())


@router.get("/reclamation/tracked", summary="Live allocations with idle time from telemetry", tags=["reclaim"])
async def list_tracked(req: Request, _: Principal) -> dict:
    return await call(req, subjects.QUERY_RECLAMATION_LIST_TRACKED, Empty())
