"""Who talks to whom on the bus: the tables docs/asyncapi.yaml is generated from (libs/contracts/asyncapi.py).

The publisher of each event type is its owner (`origins.owner_of`). The rest is declared here, because libraries
never import services; tests/unit/contracts/test_asyncapi.py holds each table to the code it describes: every
service's routing table (`routes()` in its handlers.py) and the request/reply subjects each service's code asks on.
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import BaseModel

from libs.contracts import commands as c
from libs.contracts import reports as r
from libs.contracts import subjects as s

# --- events: who consumes which type, and how ------------------------------------------------------------------
# service -> the event types its durable JetStream consumers take (the `events` of its routing table, plus its
# telemetry and rollup consumers)
DURABLE_CONSUMERS: dict[str, tuple[str, ...]] = {
    "inventory": ("io.gpupool.allocation.granted.v1", "io.gpupool.allocation.released.v1",
                  "io.gpupool.telemetry.sampled.v1"),
    "quota": ("io.gpupool.job.cancelled.v1",),
    "queue": ("io.gpupool.allocation.granted.v1", "io.gpupool.allocation.preempting.v1",
              "io.gpupool.quota.approval_decided.v1", "io.gpupool.allocation.released.v1",
              "io.gpupool.agent.work_started.v1", "io.gpupool.agent.work_load.v1"),
    "placement": ("io.gpupool.node.registered.v1", "io.gpupool.node.lost.v1", "io.gpupool.node.recovered.v1",
                  "io.gpupool.node.cordoned.v1", "io.gpupool.node.uncordoned.v1", "io.gpupool.gpu.health_changed.v1",
                  "io.gpupool.gpu.sharing_set.v1", "io.gpupool.job.submitted.v1", "io.gpupool.job.completed.v1",
                  "io.gpupool.job.cancelled.v1", "io.gpupool.job.scaled.v1", "io.gpupool.agent.work_exited.v1",
                  "io.gpupool.agent.work_ready.v1", "io.gpupool.endpoint.ready.v1",
                  "io.gpupool.job.work_updated.v1", "io.gpupool.endpoint.unready.v1",
                  "io.gpupool.quota.team_created.v1", "io.gpupool.quota.set.v1",
                  "io.gpupool.quota.priority_class_set.v1"),
    "reclamation": ("io.gpupool.allocation.granted.v1", "io.gpupool.allocation.released.v1",
                    "io.gpupool.node.lost.v1", "io.gpupool.gpu.health_changed.v1", "io.gpupool.node.cordoned.v1",
                    "io.gpupool.telemetry.sampled.v1"),
    "accounting": ("io.gpupool.job.submitted.v1", "io.gpupool.job.cancelled.v1", "io.gpupool.allocation.granted.v1",
                   "io.gpupool.allocation.released.v1", "io.gpupool.node.registered.v1", "io.gpupool.node.lost.v1",
                   "io.gpupool.node.recovered.v1", "io.gpupool.gpu.health_changed.v1",
                   "io.gpupool.gpu.orphan_detected.v1", "io.gpupool.telemetry.rolled_up.v1"),
}
# service -> the subjects it subscribes to on core NATS, live (no durable consumer): the agent takes its node's
# allocations (services/agent/handlers.py), the gateway relays events to `GET /v1/events` (services/gateway/events.py)
LIVE_SUBSCRIBERS: dict[str, tuple[str, ...]] = {
    "agent": (s.ALLOCATION_ALL,),
    "gateway": tuple(f"{s.PREFIX}.{entity}.>" for entity in s.EVENT_ENTITIES),
}

# Every CloudEvent gpupool publishes travels on one of these subjects and nothing else does: the subjects of the
# events, telemetry and rollup streams. A plain subscriber that wants the events subscribes to exactly these;
# `gpupool.>` would also bring request/reply traffic (`gpupool.cmd.>`, `gpupool.query.>`), internal signals
# (`gpupool.internal.>`, `gpupool.sim.>`) and dead letters (`gpupool.dlq.>`: copies of messages refused as poison).
CLOUDEVENT_SUBJECTS: tuple[str, ...] = (*s.EVENTS_STREAM.subjects, s.TELEMETRY_ALL, s.ROLLUP_ALL)
NOT_EVENTS: tuple[str, ...] = ("gpupool.cmd.>", "gpupool.query.>", "gpupool.internal.>", "gpupool.sim.>", s.DLQ_ALL)


# --- request/reply ----------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Rpc:
    """One request/reply subject: the request's model, the service that answers and the services that ask."""

    request: type[BaseModel]
    answers: str
    asks: tuple[str, ...]


GATEWAY = ("gateway",)
RPCS: dict[str, Rpc] = {
    f"{s.CMD_INVENTORY_REGISTER_NODE}.{{cluster}}.{{node}}": Rpc(c.RegisterNode, "inventory", ("agent",)),
    s.CMD_INVENTORY_CORDON_NODE: Rpc(c.CordonNode, "inventory", GATEWAY),
    s.CMD_INVENTORY_SET_GPU_SHARING: Rpc(c.SetGpuSharing, "inventory", GATEWAY),
    s.CMD_INVENTORY_SET_GPU_HEALTH: Rpc(c.SetGpuHealth, "inventory", GATEWAY),
    s.QUERY_INVENTORY_LIST_NODES: Rpc(c.ListNodes, "inventory", GATEWAY),
    s.QUERY_INVENTORY_GET_NODE: Rpc(c.NodeRef, "inventory", GATEWAY),
    s.QUERY_INVENTORY_POOL: Rpc(c.GetPool, "inventory", GATEWAY),
    s.QUERY_INVENTORY_ORPHANS: Rpc(c.ListOrphans, "inventory", GATEWAY),
    s.CMD_QUEUE_SUBMIT_JOB: Rpc(c.SubmitJob, "queue", GATEWAY),
    s.CMD_QUEUE_COMPLETE_JOB: Rpc(c.JobRef, "queue", GATEWAY),
    s.CMD_QUEUE_CANCEL_JOB: Rpc(c.CancelJob, "queue", GATEWAY),
    s.CMD_QUEUE_SCALE_JOB: Rpc(c.ScaleJob, "queue", GATEWAY),
    s.CMD_QUEUE_REPORT_LOAD: Rpc(c.ReportLoad, "queue", GATEWAY),
    s.CMD_QUEUE_UPDATE_WORK: Rpc(c.UpdateWork, "queue", GATEWAY),
    s.QUERY_QUEUE_GET_JOB: Rpc(c.JobRef, "queue", GATEWAY),
    s.QUERY_QUEUE_LIST_JOBS: Rpc(c.ListJobs, "queue", GATEWAY),
    s.CMD_QUOTA_ADMIT: Rpc(c.AdmitJob, "quota", ("queue",)),
    s.CMD_QUOTA_CREATE_TEAM: Rpc(c.CreateTeam, "quota", GATEWAY),
    s.CMD_QUOTA_SET_QUOTA: Rpc(c.SetQuota, "quota", GATEWAY),
    s.CMD_QUOTA_SET_PRIORITY_CLASS: Rpc(c.SetPriorityClass, "quota", GATEWAY),
    s.QUERY_QUOTA_LIST_TEAMS: Rpc(c.Empty, "quota", GATEWAY),
    s.QUERY_QUOTA_POLICY: Rpc(c.Empty, "quota", ("gateway", "placement")),
    s.CMD_QUOTA_SET_APPROVAL_RULE: Rpc(c.SetApprovalRule, "quota", GATEWAY),
    s.CMD_QUOTA_DECIDE_APPROVAL: Rpc(c.DecideApproval, "quota", GATEWAY),
    s.QUERY_QUOTA_APPROVALS: Rpc(c.ListApprovals, "quota", GATEWAY),
    s.CMD_QUOTA_REQUEST_LOAN: Rpc(c.RequestQuotaLoan, "quota", GATEWAY),
    s.QUERY_QUOTA_LOANS: Rpc(c.ListQuotaLoans, "quota", GATEWAY),
    s.QUERY_PLACEMENT_LIST_ALLOCATIONS: Rpc(c.ListAllocations, "placement", ("agent", "gateway")),
    s.QUERY_PLACEMENT_EXPLAIN: Rpc(c.JobRef, "placement", GATEWAY),
    s.QUERY_PLACEMENT_LIST_DECISIONS: Rpc(c.ListDecisions, "placement", GATEWAY),
    s.QUERY_PLACEMENT_GET_DECISION: Rpc(c.GetDecision, "placement", GATEWAY),
    s.QUERY_PLACEMENT_FRAGMENTATION: Rpc(c.GetPool, "placement", GATEWAY),
    s.CMD_PLACEMENT_RELEASE_ALLOCATION: Rpc(c.ReleaseAllocation, "placement", ("reclamation",)),
    s.QUERY_RECLAMATION_LIST_TRACKED: Rpc(c.Empty, "reclamation", GATEWAY),
    s.QUERY_RECLAMATION_POLICIES: Rpc(c.Empty, "reclamation", GATEWAY),
    s.CMD_RECLAMATION_SET_POLICY: Rpc(c.SetReclaimPolicy, "reclamation", GATEWAY),
    s.QUERY_ACCOUNTING_LIST_USAGE: Rpc(c.ListUsage, "accounting", GATEWAY),
    s.QUERY_ACCOUNTING_REPORT_USAGE: Rpc(r.UsageReportQuery, "accounting", GATEWAY),
    s.QUERY_ACCOUNTING_REPORT_EFFICIENCY: Rpc(r.EfficiencyReportQuery, "accounting", GATEWAY),
    s.QUERY_ACCOUNTING_REPORT_CAPACITY: Rpc(r.CapacityReportQuery, "accounting", GATEWAY),
    s.QUERY_ACCOUNTING_REPORT_WASTE: Rpc(r.WasteReportQuery, "accounting", GATEWAY),
    s.QUERY_ACCOUNTING_EXPORT_HISTORY: Rpc(r.HistoryQuery, "accounting", GATEWAY),
    s.QUERY_ACCOUNTING_UTILIZATION: Rpc(r.UtilizationQuery, "accounting", GATEWAY),
    s.QUERY_ACCOUNTING_COST_RATES: Rpc(r.ListCostRates, "accounting", GATEWAY),
    s.CMD_ACCOUNTING_SET_COST_RATE: Rpc(r.SetCostRate, "accounting", GATEWAY),
    "gpupool.query.agent.{cluster}.{node}.logs": Rpc(c.ReadLogs, "agent", GATEWAY),
}
# every service answers a ping on `gpupool.query.<service>.ping` (libs/runtime/service.py); the gateway's /readyz
# and `gpupool up` ask
PING_SUBJECT = "gpupool.query.{service}.ping"
