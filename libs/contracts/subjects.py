"""Every NATS subject and stream name gpupool uses, spelled here and nowhere else.

Naming: `gpupool.<entity>.<event>` for events (each entity owned by exactly one service),
`gpupool.cmd.<service>.<verb>` for commands and `gpupool.query.<service>.<what>` for reads (both request/reply on
core NATS, answered by a queue group of the owning service), `gpupool.telemetry.<cluster>.<node>` for agent samples,
`gpupool.dlq.<consumer>` for dead letters.
"""

from __future__ import annotations

from dataclasses import dataclass

PREFIX = "gpupool"

# --- events (JetStream stream EVENTS) -------------------------------------------------------------------------
NODE_REGISTERED = "gpupool.node.registered"
NODE_LOST = "gpupool.node.lost"
NODE_RECOVERED = "gpupool.node.recovered"
NODE_CORDONED = "gpupool.node.cordoned"
NODE_UNCORDONED = "gpupool.node.uncordoned"
GPU_HEALTH_CHANGED = "gpupool.gpu.health_changed"
GPU_SHARING_SET = "gpupool.gpu.sharing_set"
GPU_ORPHAN_DETECTED = "gpupool.gpu.orphan_detected"
JOB_SUBMITTED = "gpupool.job.submitted"
JOB_STARTED = "gpupool.job.started"
JOB_COMPLETED = "gpupool.job.completed"
JOB_CANCELLED = "gpupool.job.cancelled"
JOB_SCALED = "gpupool.job.scaled"
JOB_AUTOSCALED = "gpupool.job.autoscaled"
JOB_WORK_UPDATED = "gpupool.job.work_updated"
JOB_STATE_CHANGED = "gpupool.job.state_changed"
ALLOCATION_GRANTED = "gpupool.allocation.granted"
ALLOCATION_RELEASED = "gpupool.allocation.released"
USAGE_RECORDED = "gpupool.usage.recorded"
USAGE_RATE_SET = "gpupool.usage.rate_set"
QUOTA_TEAM_CREATED = "gpupool.quota.team_created"
QUOTA_SET = "gpupool.quota.set"
QUOTA_PRIORITY_CLASS_SET = "gpupool.quota.priority_class_set"
QUOTA_APPROVAL_DECIDED = "gpupool.quota.approval_decided"
QUOTA_APPROVAL_REQUESTED = "gpupool.quota.approval_requested"
QUOTA_APPROVAL_WITHDRAWN = "gpupool.quota.approval_withdrawn"
RECLAIM_WARNED = "gpupool.reclaim.warned"
RECLAIM_DECIDED = "gpupool.reclaim.decided"
ALLOCATION_PREEMPTING = "gpupool.allocation.preempting"
ALLOCATION_GANG_READY = "gpupool.allocation.gang_ready"
DECISION_CYCLE = "gpupool.decision.cycle"
AGENT_MIG_APPLIED = "gpupool.agent.mig_applied"
AGENT_FRACTION_EXCEEDED = "gpupool.agent.fraction_exceeded"
AGENT_WORK_STARTED = "gpupool.agent.work_started"
AGENT_WORK_READY = "gpupool.agent.work_ready"
AGENT_WORK_EXITED = "gpupool.agent.work_exited"
AGENT_WORK_LOAD = "gpupool.agent.work_load"
AGENT_ALL = "gpupool.agent.>"
ENDPOINT_READY = "gpupool.endpoint.ready"
ENDPOINT_UNREADY = "gpupool.endpoint.unready"
ALLOCATION_ALL = "gpupool.allocation.>"
JOB_ALL = "gpupool.job.>"

EVENT_ENTITIES = ("node", "gpu", "job", "allocation", "quota", "reclaim", "usage", "decision", "agent", "endpoint")

# --- telemetry (JetStream stream TELEMETRY) -------------------------------------------------------------------
TELEMETRY_ALL = "gpupool.telemetry.>"


def node_identity(cluster: str, node: str) -> str:
    """The NATS identity of one node's agent: `agent-<cluster>-<node>`."""
    return f"agent-{token(cluster)}-{token(node)}"


def inbox_prefix(identity: str) -> str:
    """Where replies to an identity arrive: the server lets it subscribe only to `_INBOX_<identity>.>`."""
    return f"_INBOX_{identity}"


def of_node(base: str, cluster: str, node: str) -> str:
    """A node agent's event subject: `<base>.<cluster>.<node>`."""
    return f"{base}.{token(cluster)}.{token(node)}"


def telemetry(cluster: str, node: str) -> str:
    return f"gpupool.telemetry.{token(cluster)}.{token(node)}"


# --- one-minute telemetry rollups (JetStream stream ROLLUPS) -------------------------------------------------
ROLLUP_ALL = "gpupool.rollup.>"


def rollup(cluster: str, node: str) -> str:
    return f"gpupool.rollup.{token(cluster)}.{token(node)}"


# --- dead letters (JetStream stream DLQ) ----------------------------------------------------------------------
DLQ_ALL = "gpupool.dlq.>"


def dead_letter(consumer: str) -> str:
    return f"gpupool.dlq.{token(consumer)}"


# --- commands and queries (core NATS request/reply, never captured by a stream) -------------------------------
CMD_INVENTORY_REGISTER_NODE = "gpupool.cmd.inventory.register_node"  # .<cluster>.<node>: a node registers itself


def register_node(cluster: str, node: str) -> str:
    """Where a node's agent registers it: only that node's identity may publish there."""
    return f"{CMD_INVENTORY_REGISTER_NODE}.{token(cluster)}.{token(node)}"
CMD_INVENTORY_CORDON_NODE = "gpupool.cmd.inventory.cordon_node"
CMD_INVENTORY_SET_GPU_SHARING = "gpupool.cmd.inventory.set_gpu_sharing"
CMD_INVENTORY_SET_GPU_HEALTH = "gpupool.cmd.inventory.set_gpu_health"
QUERY_INVENTORY_GET_NODE = "gpupool.query.inventory.get_node"
QUERY_INVENTORY_ORPHANS = "gpupool.query.inventory.orphans"
CMD_QUEUE_SUBMIT_JOB = "gpupool.cmd.queue.submit_job"
CMD_QUEUE_COMPLETE_JOB = "gpupool.cmd.queue.complete_job"
CMD_QUEUE_CANCEL_JOB = "gpupool.cmd.queue.cancel_job"
CMD_QUEUE_SCALE_JOB = "gpupool.cmd.queue.scale_job"
CMD_QUEUE_REPORT_LOAD = "gpupool.cmd.queue.report_load"
CMD_QUEUE_UPDATE_WORK = "gpupool.cmd.queue.update_work"
CMD_QUOTA_ADMIT = "gpupool.cmd.quota.admit"
CMD_QUOTA_CREATE_TEAM = "gpupool.cmd.quota.create_team"
CMD_QUOTA_SET_QUOTA = "gpupool.cmd.quota.set_quota"
CMD_QUOTA_SET_PRIORITY_CLASS = "gpupool.cmd.quota.set_priority_class"
QUERY_QUOTA_POLICY = "gpupool.query.quota.policy"
CMD_QUOTA_SET_APPROVAL_RULE = "gpupool.cmd.quota.set_approval_rule"
CMD_QUOTA_DECIDE_APPROVAL = "gpupool.cmd.quota.decide_approval"
QUERY_QUOTA_APPROVALS = "gpupool.query.quota.approvals"
CMD_QUOTA_REQUEST_LOAN = "gpupool.cmd.quota.request_loan"
QUERY_QUOTA_LOANS = "gpupool.query.quota.loans"
QUERY_QUEUE_GET_JOB = "gpupool.query.queue.get_job"
QUERY_QUEUE_LIST_JOBS = "gpupool.query.queue.list_jobs"
QUERY_INVENTORY_LIST_NODES = "gpupool.query.inventory.list_nodes"
QUERY_INVENTORY_POOL = "gpupool.query.inventory.pool"
QUERY_PLACEMENT_LIST_ALLOCATIONS = "gpupool.query.placement.list_allocations"
QUERY_PLACEMENT_EXPLAIN = "gpupool.query.placement.explain"
QUERY_PLACEMENT_LIST_DECISIONS = "gpupool.query.placement.list_decisions"
QUERY_PLACEMENT_GET_DECISION = "gpupool.query.placement.get_decision"
QUERY_PLACEMENT_FRAGMENTATION = "gpupool.query.placement.fragmentation"
CMD_PLACEMENT_RELEASE_ALLOCATION = "gpupool.cmd.placement.release_allocation"
QUERY_RECLAMATION_POLICIES = "gpupool.query.reclamation.policies"
CMD_RECLAMATION_SET_POLICY = "gpupool.cmd.reclamation.set_policy"
QUERY_ACCOUNTING_LIST_USAGE = "gpupool.query.accounting.list_usage"
QUERY_ACCOUNTING_REPORT_USAGE = "gpupool.query.accounting.report_usage"
QUERY_ACCOUNTING_REPORT_EFFICIENCY = "gpupool.query.accounting.report_efficiency"
QUERY_ACCOUNTING_REPORT_CAPACITY = "gpupool.query.accounting.report_capacity"
QUERY_ACCOUNTING_REPORT_WASTE = "gpupool.query.accounting.report_waste"
QUERY_ACCOUNTING_EXPORT_HISTORY = "gpupool.query.accounting.export_history"
QUERY_ACCOUNTING_UTILIZATION = "gpupool.query.accounting.utilization"
QUERY_ACCOUNTING_COST_RATES = "gpupool.query.accounting.cost_rates"
CMD_ACCOUNTING_SET_COST_RATE = "gpupool.cmd.accounting.set_cost_rate"
QUERY_QUOTA_LIST_TEAMS = "gpupool.query.quota.list_teams"
QUERY_RECLAMATION_LIST_TRACKED = "gpupool.query.reclamation.list_tracked"




def agent_logs(cluster: str, node: str) -> str:
    """Where a node's agent answers reads of its work's logs (request/reply; the gateway asks, team-scoped)."""
    return f"gpupool.query.agent.{token(cluster)}.{token(node)}.logs"


# Fault injection for the simulated agent fleet (core NATS, development and tests only).
SIM_FAULT = "gpupool.sim.fault"

# A placement replica that committed a change while another holds the lease tells the leader (core NATS, no payload,
# every replica subscribes; only the leader acts): otherwise the leader would wait for its cycle interval.
PLACEMENT_WAKE = "gpupool.internal.placement.wake"


def health_ping(service: str) -> str:
    """Each service answers here so `gpupool up` and the gateway's /readyz can see it is alive on the bus."""
    return f"gpupool.query.{service}.ping"


def matches(pattern: str, subject: str) -> bool:
    """NATS wildcard matching: `*` is one token, `>` one or more trailing tokens."""
    p, s = pattern.split("."), subject.split(".")
    for i, tok in enumerate(p):
        if tok == ">":
            return len(s) > i
        if i >= len(s) or (tok != "*" and tok != s[i]):
            return False
    return len(p) == len(s)


def token(value: str) -> str:
    """Make a value safe as one subject token: NATS reserves '.', '*', '>' and whitespace."""
    out = []
    for ch in value:
        out.append("_" if ch in ".*> \t\r\n" else ch)
    return "".join(out) or "_"


# --- streams ---------------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class StreamSpec:
    """A JetStream stream gpupool declares. The duplicate window is explicit: the outbox relay may republish an
    event after a crash, and JetStream drops the copy if it arrives within this window (consumers' inboxes catch
    anything later)."""

    name: str
    subjects: tuple[str, ...]
    duplicate_window_s: float
    max_age_s: float
    max_bytes: int = -1
    max_msgs_per_subject: int = -1


EVENTS_STREAM = StreamSpec(
    name="GPUPOOL_EVENTS",
    subjects=tuple(f"gpupool.{entity}.>" for entity in EVENT_ENTITIES),
    duplicate_window_s=20 * 60,
    max_age_s=30 * 24 * 3600,
)
TELEMETRY_STREAM = StreamSpec(
    name="GPUPOOL_TELEMETRY",
    subjects=(TELEMETRY_ALL,),
    duplicate_window_s=60,
    max_age_s=3600,
    max_msgs_per_subject=600,
)
DLQ_STREAM = StreamSpec(
    name="GPUPOOL_DLQ",
    subjects=(DLQ_ALL,),
    duplicate_window_s=2 * 60,
    max_age_s=30 * 24 * 3600,
)
ROLLUPS_STREAM = StreamSpec(
    name="GPUPOOL_ROLLUPS",
    subjects=(ROLLUP_ALL,),
    duplicate_window_s=5 * 60,
    max_age_s=8 * 24 * 3600,
)
STREAMS: tuple[StreamSpec, ...] = (EVENTS_STREAM, TELEMETRY_STREAM, DLQ_STREAM, ROLLUPS_STREAM)
