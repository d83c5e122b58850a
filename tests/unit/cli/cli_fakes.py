"""A fake gateway for the CLI/client unit tests: an httpx.MockTransport answering like /v1 does, recording calls."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import httpx

NOW = "2025-01-01T12:00:00+00:00"


def problem(status: int, reason: str, detail: str) -> httpx.Response:
    return httpx.Response(status, headers={"content-type": "application/problem+json"},
                          content=json.dumps({"type": f"https://gpupool.dev/problems/{reason}", "title": "x",
                                              "status": status, "detail": detail, "reason": reason}))


def job(job_id: str = "j1", **over: Any) -> dict[str, Any]:
    doc = {"job_id": job_id, "name": "demo", "team": "research", "project": "default", "kind": "batch",
           "priority_class": "normal", "gpus": 2, "gpu_models": ["H100-80GB"], "state": "running",
           "submitted_at": NOW, "started_at": NOW, "finished_at": None, "allocation_id": "a1",
           "node": "node-0", "cluster": "sim", "message": None}
    doc.update(over)
    return doc


def gpu(idx: int, *, util: float | None = 0.0, health: str = "healthy", model: str = "H100-80GB") -> dict[str, Any]:
    return {"uuid": f"GPU-{model}-{idx}", "index": idx, "model": model, "name": model, "memory_mib": 81920,
            "numa_node": 0, "nvlink_peers": [], "mig_mode": False, "health": health, "health_reasons": [],
            "telemetry": None if util is None else {
                "sampled_at": NOW, "utilization_gpu_pct": util, "utilization_memory_pct": 1.0,
                "memory_used_mib": 2048, "temperature_c": 40.0, "power_w": 120.5, "ecc_volatile_sbe": 0,
                "ecc_volatile_dbe": 0, "xid_last": None}}


def node(name: str, gpus: list[dict[str, Any]], cluster: str = "sim") -> dict[str, Any]:
    return {"cluster": cluster, "node": name, "hostname": name, "cpu_count": 64, "memory_mib": 1, "driver_version": "",
            "agent_version": "", "labels": {}, "state": "ready", "registered_at": NOW, "last_seen_at": NOW,
            "cpu_util_pct": 3.0, "memory_used_mib": 1, "gpus": gpus}


def allocation(alloc_id: str, job_id: str, gpu_uuids: list[str], *, released: bool = False) -> dict[str, Any]:
    return {"allocation_id": alloc_id, "job_id": job_id, "team": "research", "project": "default", "cluster": "sim",
            "node": "node-0", "granted_at": NOW, "released_at": NOW if released else None, "release_reason": None,
            "gpus": [{"uuid": u, "index": i, "model": "H100-80GB"} for i, u in enumerate(gpu_uuids)]}


class FakeGateway:
    """Routes keyed by (method, path) → a function of the request returning an httpx.Response (or a JSON doc)."""

    def __init__(self) -> None:
        self.calls: list[httpx.Request] = []
        self.routes: dict[tuple[str, str], Callable[[httpx.Request], Any]] = {}

    def on(self, method: str, path: str, answer: Any) -> None:
        self.routes[(method, path)] = answer if callable(answer) else (lambda _req: answer)

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.calls.append(request)
        handler = self.routes.get((request.method, request.url.path))
        if handler is None:
            return problem(404, "NotFound", f"no route {request.method} {request.url.path}")
        out = handler(request)
        if isinstance(out, httpx.Response):
            return out
        return httpx.Response(200, json=out)

    @property
    def transport(self) -> httpx.MockTransport:
        return httpx.MockTransport(self)


def pool_doc() -> dict[str, Any]:
    """GET /v1/pool as the gateway answers it (services/gateway/pool.py): two clusters, three (cluster, model)s."""
    def counts(model: str | None, total: int, alloc: int, in_use: int, idle: int, unhealthy: int) -> dict[str, Any]:
        doc = {"total": total, "healthy": total - unhealthy, "unhealthy": unhealthy, "on_lost_nodes": 0,
               "in_use": in_use, "allocated": alloc, "allocated_idle": idle, "free": total - unhealthy - alloc}
        return doc if model is None else {"model": model, **doc}

    return {"clusters": [
        {"cluster": "sim", "models": [counts("H100-80GB", 8, 4, 3, 1, 1), counts("A100-80GB", 8, 0, 0, 0, 0)],
         "totals": counts(None, 16, 4, 3, 1, 1), "nodes": [{"node": "n0"}]},
        {"cluster": "edge", "models": [counts("L4", 2, 1, 1, 0, 0)], "totals": counts(None, 2, 1, 1, 0, 0),
         "nodes": []}],
        "all": {"models": [], "totals": counts(None, 18, 5, 4, 1, 1)}, "in_use_util_pct": 5.0, "fresh_within_s": 30}


def approval(approval_id: str = "ap1", state: str = "pending", **over: Any) -> dict[str, Any]:
    doc = {"approval_id": approval_id, "job_id": "j1", "job_name": "big", "team": "research", "project": "default",
           "gpus": 6, "priority_class": "normal", "reasons": ["more than 4 GPUs"], "requested_by": "alice",
           "state": state, "comment": "", "decided_by": None, "created_at": NOW, "decided_at": None}
    doc.update(over)
    return doc


def quota(path: str = "default/research", gpu_model: str = "H100-80GB", **over: Any) -> dict[str, Any]:
    doc = {"path": path, "gpu_model": gpu_model, "guaranteed": 8.0, "borrowing_limit": 4.0, "lending_limit": None,
           "weight": 1.0, "revision": 3, "updated_at": NOW}
    doc.update(over)
    return doc


def reclaim_policy(kind: str = "dev", **over: Any) -> dict[str, Any]:
    doc = {"kind": kind, "idle_after_s": 1800.0, "idle_util_pct": 5.0, "grace_s": 300.0,
           "enforce_max_runtime": True, "updated_at": NOW}
    doc.update(over)
    return doc
