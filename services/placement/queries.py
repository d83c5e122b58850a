"""Placement's read-only queries (explain, decisions, allocations): what the store says, shaped for the gateway."""

from __future__ import annotations

import base64
import gzip
import json
from types import SimpleNamespace

from libs.contracts.commands import GetDecision, JobRef, ListAllocations, ListDecisions, Reply, page
from libs.runtime.service import ServiceRuntime
from services.placement import store
from services.placement.domain import workload_environment
from services.placement.recording import stored_texts


class PlacementQueries:
    """The query half of `PlacementHandlers` (its routes answer these)."""

    rt: ServiceRuntime

    async def explain(self, cmd: JobRef) -> Reply:
        async with self.rt.pool.acquire() as conn:
            doc = await store.explain(conn, cmd.job_id)
        if doc is None:
            return Reply.failure(404, "JobUnknownToPlacement",
                                 f"placement has not seen job {cmd.job_id} (not submitted, or not yet delivered)")
        return Reply.success({"job_id": cmd.job_id, **doc})

    async def list_decisions(self, cmd: ListDecisions) -> Reply:
        async with self.rt.pool.acquire() as conn:
            rows = await store.list_decisions(conn, limit=cmd.limit + 1, before=cmd.before)
        return Reply.success(page(rows, cmd.limit, lambda r: json.loads(r["summary"]), lambda i: i["cycle_id"]))

    async def get_decision(self, cmd: GetDecision) -> Reply:
        """The recorded input travels gzipped (base64): a large fleet's snapshot stays small."""
        async with self.rt.pool.acquire() as conn:
            row = await store.get_decision(conn, cmd.cycle_id)
        if row is None:
            return Reply.failure(404, "DecisionNotFound",
                                 f"no recorded cycle {cmd.cycle_id} (never recorded, or older than the retention)")
        input_text, plan_text = stored_texts(row)
        return Reply.success({**json.loads(row["summary"]), "input_gzip_base64": base64.b64encode(
            gzip.compress(input_text.encode(), compresslevel=6)).decode(), "plan": json.loads(plan_text)})

    async def list_allocations(self, cmd: ListAllocations) -> Reply:
        async with self.rt.pool.acquire() as conn:
            rows = await store.list_allocations(conn, job_id=cmd.job_id, active=cmd.active, limit=cmd.limit + 1,
                                                after=cmd.after, cluster=cmd.cluster, node=cmd.node)
        def view(r) -> dict:  # type: ignore[no-untyped-def]
            gpus = json.loads(r["gpus"]) if isinstance(r["gpus"], str) else r["gpus"]
            return {**{k: r[k] for k in ("allocation_id", "job_id", "replica", "team", "project", "cluster", "node",
                                         "release_reason", "preempt_reason", "attempt", "kind", "cpu_milli",
                                         "memory_mib", "preemptible")},
                    "work": json.loads(r["work"]) if r["work"] else None,
                    # the GPUs as placement's store holds them (written from a validated grant): read, not
                    # validated again — at fleet size the agents' listing is thousands of rows
                    "environment": {**workload_environment([SimpleNamespace(**g) for g in gpus],  # type: ignore[misc]
                                                           r["allocation_id"]),
                                    **json.loads(r["rendezvous_env"] or "{}")} if r["work"] else {},
                    "gang_wait": r["gang_wait"],
                    "endpoint": {"url": r["endpoint_url"], "ports": json.loads(r["endpoint_ports"] or "{}"),
                                 "ready": bool(r["endpoint_ready"]), "since": r["endpoint_at"].isoformat(),
                                 "reason": r["endpoint_reason"] or None} if r["endpoint_url"] else None,
                    "exit": json.loads(r["exit"]) if r["exit"] else None,
                    "preempt_deadline": r["preempt_deadline"].isoformat() if r["preempt_deadline"] else None,
                    "granted_at": r["granted_at"].isoformat(),
                    "released_at": r["released_at"].isoformat() if r["released_at"] else None,
                    "gpus": gpus}

        return Reply.success(page(rows, cmd.limit, view, lambda item: item["allocation_id"]))


