"""Nodes and GPUs as operators manage them: one node's view, cordon / drain / uncordon, a GPU's sharing mode, an
operator's word on a GPU's health (clear a quarantine, or quarantine now), and the orphans inventory reported.

Inventory owns all of it; these routes are request/reply to it plus an audit entry with before/after. Changes are
for operators and platform admins; reads for everyone who may read the pool.
"""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Path, Query, Request
from pydantic import Field

from libs.contracts import subjects
from libs.contracts.api import GpuChange, Node
from libs.contracts.api_pages import OrphanPage
from libs.contracts.commands import (
    NAME_PATTERN,
    CordonNode,
    ListOrphans,
    NodeRef,
    SetGpuHealth,
    SetGpuSharing,
)
from services.gateway.bodies import RequestBody
from services.gateway.domain import Action
from services.gateway.handlers import ERRORS, Caller, call, live_allocations, record, require, returns
from services.gateway.pool import NODE_FACTS_EXAMPLE, host_reserved

router = APIRouter(prefix="/v1", responses=ERRORS, tags=["nodes"])

NODE_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,252}$"
NodeName = Annotated[str, Path(pattern=NODE_PATTERN, description="Node name (as the agent registered it)")]
GpuIndex = Annotated[int, Path(ge=0, le=255, description="The GPU's index on the node")]
Cluster = Annotated[str | None, Query(pattern=NAME_PATTERN, description="Needed only when the node name exists in "
                                                                       "several clusters")]


class CordonBody(RequestBody):
    model_config = {"extra": "forbid", "json_schema_extra": {"examples": [{"reason": "kernel upgrade"}]}}
    reason: str = Field(default="", max_length=500)


class SharingBody(RequestBody):
    model_config = {"extra": "forbid", "json_schema_extra": {"examples": [{"mode": "fractional"}]}}
    mode: Literal["exclusive", "fractional", "mig"] = Field(
        description="exclusive: whole GPUs only; fractional: shares of compute and memory (CUDA MPS); mig: MIG "
                    "slices (models with MIG profiles only). Held work is never moved: a GPU that holds work takes "
                    "no new work and switches once it is released")


class HealthBody(RequestBody):
    model_config = {"extra": "forbid", "json_schema_extra": {"examples": [
        {"action": "clear", "reason": "GPU reset, nvidia-smi -q clean"}, {"action": "quarantine",
                                                                         "reason": "fan failure"}]}}
    action: Literal["clear", "quarantine"] = Field(
        description="clear: a quarantined GPU enters probation (healthy after a clean window), a suspect or "
                    "probation GPU is healthy at once; quarantine: out of service now (its work is released)")
    reason: str = Field(default="", max_length=500)


def _target(cluster: str | None, node: str) -> str:
    return f"{cluster}/{node}" if cluster else node


@router.get("/nodes/{node}", summary="One node: facts, state, cordon, and each GPU's health state, sharing mode, "
            "holder and latest telemetry",
            **returns(Node, example={
                "cluster": "c1", "node": "node-a", "state": "ready", "cordoned": False, **NODE_FACTS_EXAMPLE,
                "cpu_allocated_milli": 64000, "memory_allocated_mib": 524288, "gpus": []}),
            description="`cpu_allocated_milli` / `memory_allocated_mib`: the host CPU and memory live allocations "
                        "reserve on the node (jobs' `cpu_milli` / `memory_mib`), beside its `cpu_count` and "
                        "`memory_mib`.")
async def get_node(node: NodeName, req: Request, caller: Caller, cluster: Cluster = None) -> dict:
    require(caller, Action.POOL_READ)
    found = await call(req, subjects.QUERY_INVENTORY_GET_NODE, NodeRef(cluster=cluster, node=node))
    return {**found, **host_reserved(await live_allocations(req), found["cluster"], found["node"])}


async def _cordon(req: Request, caller, node: str, cluster: str | None, action: str,  # type: ignore[no-untyped-def]
                  body: CordonBody | None) -> dict:
    require(caller, Action.NODE_MANAGE)
    before = await call(req, subjects.QUERY_INVENTORY_GET_NODE, NodeRef(cluster=cluster, node=node))
    result = await call(req, subjects.CMD_INVENTORY_CORDON_NODE, CordonNode(
        cluster=before["cluster"], node=node, action=action, reason=body.reason if body else "", by=caller.subject))
    after = result["node"]
    await record(req, caller, f"node.{action}", _target(before["cluster"], node),
                 {"cordoned": before["cordoned"], "drained": before["drained"]},
                 {"cordoned": after["cordoned"], "drained": after["drained"], "changed": result["changed"]})
    return after


@router.post("/nodes/{node}/cordon", **returns(Node), summary="Cordon: no new work is placed on the node (running work stays)")
async def cordon(node: NodeName, req: Request, caller: Caller, cluster: Cluster = None,
                 body: CordonBody | None = None) -> dict:
    return await _cordon(req, caller, node, cluster, "cordon", body)


@router.post("/nodes/{node}/drain", **returns(Node), summary="Drain: cordon, and take the node's allocations back (reason Drained; "
             "restartable jobs are requeued elsewhere)")
async def drain(node: NodeName, req: Request, caller: Caller, cluster: Cluster = None,
                body: CordonBody | None = None) -> dict:
    return await _cordon(req, caller, node, cluster, "drain", body)


@router.post("/nodes/{node}/uncordon", **returns(Node), summary="Uncordon: the node takes new work again (once it is ready)")
async def uncordon(node: NodeName, req: Request, caller: Caller, cluster: Cluster = None) -> dict:
    return await _cordon(req, caller, node, cluster, "uncordon", None)


@router.put("/nodes/{node}/gpus/{index}/sharing", **returns(GpuChange), summary="Set how one GPU is shared: exclusive, fractional or mig")
async def set_sharing(node: NodeName, index: GpuIndex, body: SharingBody, req: Request, caller: Caller,
                      cluster: Cluster = None) -> dict:
    """Held work is never moved: a GPU that holds work keeps its mode and takes no new work (`draining_to` in the
    answer and in the node view) until its last allocation is released, then switches; an empty GPU switches now
    (`changed`). The node's agent turns the GPU's MIG mode on or off to match. `422 SharingModeUnsupported`: `mig`
    on a model without MIG profiles."""
    require(caller, Action.NODE_MANAGE)
    result = await call(req, subjects.CMD_INVENTORY_SET_GPU_SHARING, SetGpuSharing(
        cluster=cluster, node=node, index=index, mode=body.mode, by=caller.subject))
    await record(req, caller, "gpu.sharing", f"{_target(result['cluster'], node)}/{index}",
                 {"mode": result["before"]}, {"mode": result["mode"], "draining_to": result["draining_to"]})
    return result


@router.post("/nodes/{node}/gpus/{index}/health", **returns(GpuChange), summary="An operator's word on a GPU's health: clear a "
             "quarantine (the GPU enters probation) or quarantine it now")
async def set_health(node: NodeName, index: GpuIndex, body: HealthBody, req: Request, caller: Caller,
                     cluster: Cluster = None) -> dict:
    require(caller, Action.NODE_MANAGE)
    result = await call(req, subjects.CMD_INVENTORY_SET_GPU_HEALTH, SetGpuHealth(
        cluster=cluster, node=node, index=index, action=body.action, reason=body.reason, by=caller.subject))
    await record(req, caller, f"gpu.{body.action}", f"{_target(result['cluster'], node)}/{index}",
                 {"state": result["before"]}, {"state": result["state"], "reason": body.reason})
    return result


@router.get("/orphans", **returns(OrphanPage), summary="Waste inventory saw: processes on GPUs no allocation holds, allocations whose GPUs "
            "run no process")
async def list_orphans(req: Request, caller: Caller, cluster: Cluster = None,
                       open_only: Annotated[bool, Query(alias="open", description="only those still going on")] = True,
                       limit: Annotated[int, Query(ge=1, le=1000)] = 100,
                       cursor: Annotated[str | None, Query(max_length=18, pattern=r"^[0-9]{1,18}$")] = None) -> dict:
    require(caller, Action.POOL_READ)
    return await call(req, subjects.QUERY_INVENTORY_ORPHANS, ListOrphans(cluster=cluster, open_only=open_only,
                                                                         limit=limit, after=cursor))
