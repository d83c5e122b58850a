"""GET /v1/jobs/{job_id}/endpoints: where each live replica of a job serves and whether it is ready, from
placement's allocations (which keep what the agents announce as endpoint.ready / endpoint.unready). A load
balancer or service mesh that follows the events gets the same; this is its snapshot."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path, Request

from libs.contracts import subjects
from libs.contracts.commands import ListAllocations
from services.gateway.domain import Action
from services.gateway.handlers import ERRORS, Caller, call, job_team, require

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
            responses={200: {"content": {"application/json": {"example": EXAMPLE}}}})
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
