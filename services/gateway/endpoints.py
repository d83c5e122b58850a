"""A service's own routes. GET /v1/jobs/{job_id}/endpoints: where each live replica of a job serves and whether it
is ready, from placement's allocations (which keep what the agents announce as endpoint.ready / endpoint.unready;
a load balancer or service mesh that follows the events gets the same, this is its snapshot). POST
/v1/jobs/{job_id}/load: the load the service reports for its autoscaler."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path, Request
from pydantic import Field

from libs.contracts import subjects
from libs.contracts.api_pages import Endpoints, LoadReport
from libs.contracts.commands import ListAllocations, ReportLoad
from services.gateway.domain import Action
from services.gateway.handlers import (
    ERRORS,
    Caller,
    RequestBody,
    call,
    job_team,
    require,
    require_on_job,
    returns,
)

router = APIRouter(prefix="/v1", responses=ERRORS)
EXAMPLE = {"job_id": "01a2...", "items": [
    {"replica": 0, "node": "sim-node-0", "cluster": "local", "allocation_id": "01a2...",
     "url": "http://127.0.0.2:41833", "ports": {"http": 41833}, "ready": True, "since": "2026-12-01T22:00:00Z",
     "reason": None}]}


def endpoint_item(allocation: dict[str, Any]) -> dict[str, Any]:
    endpoint = allocation.get("endpoint") or {}
    return {"replica": allocation["replica"], "node": allocation["node"], "cluster": allocation["cluster"],
            "allocation_id": allocation["allocation_id"], "url": endpoint.get("url"),
            "ports": endpoint.get("ports") or {}, "ready": bool(endpoint.get("ready")),
            "since": endpoint.get("since"), "reason": endpoint.get("reason")}


@router.get("/jobs/{job_id}/endpoints", summary="Where a job's replicas serve, and which are ready", tags=["jobs"],
            description="One item per live replica (allocation) of the job: `url` (its first port on its node's "
                        "address; null until its agent announced it), `ports` (every named port → host port), "
                        "`ready` (its health check passes, or, without one, its work started), `since`, and "
                        "`reason` when not ready (`HealthCheckFailed`, `Draining`, the work's exit). Follow "
                        "changes as `endpoint.ready` / `endpoint.unready` events (GET /v1/events).",
            **returns(Endpoints, example=EXAMPLE))
async def job_endpoints(job_id: Annotated[str, Path(max_length=64)], req: Request, caller: Caller) -> dict:
    require(caller, Action.JOB_READ)
    job = await job_team(req, job_id)
    require(caller, Action.JOB_READ, job["team"])
    items: list[dict[str, Any]] = []
    after: str | None = None
    while True:
        page = await call(req, subjects.QUERY_PLACEMENT_LIST_ALLOCATIONS,
                          ListAllocations(job_id=job_id, active=True, limit=1000, after=after))
        items += [endpoint_item(a) for a in page["items"]]
        after = page.get("next")
        if not after:
            break
    return {"job_id": job_id, "items": sorted(items, key=lambda i: i["replica"])}


class LoadBody(RequestBody):
    model_config = {"extra": "forbid", "json_schema_extra": {"examples": [{"value": 37}, {"value": 4,
                                                                                        "reporter": "replica-1"}]}}
    value: float = Field(ge=0, le=1e12, description="requests in flight, queue length: the unit of the target")
    reporter: str = Field(default="", max_length=64, pattern=r"^[A-Za-z0-9._-]*$",
                          description="who reports ('' the service as a whole; or each replica its own): the "
                                      "service's load is the sum of each reporter's latest value")


@router.post("/jobs/{job_id}/load", **returns(LoadReport, 202), status_code=202, summary="Report a service's load for its autoscaler",
             tags=["jobs"],
             description="Kept as the reporter's latest value; the queue's autoscaler (every second) scales the "
                         "job toward ceil(load / target) replicas within min_replicas..max_replicas, per its "
                         "stabilisation windows and cool-down; each step is a `job.autoscaled` event and an "
                         "`Autoscaled:<a>-><b>` history entry (`gpupool describe`). A report older than the "
                         "policy's `sample_ttl_s` no longer counts. `409 NotAutoscaled`: the job has no policy; "
                         "`409 LoadNotPushed`: it autoscales on what its agents sample (gpu_utilization, metric).")
async def report_load(job_id: Annotated[str, Path(max_length=64)], body: LoadBody, req: Request,
                      caller: Caller) -> dict:
    await require_on_job(req, caller, Action.JOB_SUBMIT, job_id)
    return await call(req, subjects.CMD_QUEUE_REPORT_LOAD,
                      ReportLoad(job_id=job_id, value=body.value, reporter=body.reporter))
