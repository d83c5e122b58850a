"""Prometheus metrics shared by every service, and the /metrics endpoint for services without an HTTP server."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram, start_http_server

BUS_MESSAGES = Counter(
    "gpupool_bus_messages_total", "Messages handled by a consumer, by outcome", ["consumer", "outcome"]
)
BUS_DEAD_LETTERS = Counter(
    "gpupool_bus_dead_letters_total", "Messages sent to the dead-letter stream", ["consumer", "reason"]
)
BUS_HANDLE_SECONDS = Histogram(
    "gpupool_bus_handle_seconds", "Time to handle one message", ["consumer"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
)
BUS_PUBLISHED = Counter("gpupool_bus_published_total", "Messages published to JetStream", ["subject_root"])
OUTBOX_PENDING = Gauge("gpupool_outbox_pending", "Outbox rows not yet published", ["service"])
OUTBOX_RELAYED = Counter("gpupool_outbox_relayed_total", "Outbox rows published by the relay", ["service"])
STORE_PRUNED = Counter("gpupool_store_pruned_rows_total",
                       "Rows deleted by retention (published outbox rows, processed inbox rows)", ["service", "table"])
RPC_REQUESTS = Counter("gpupool_rpc_requests_total", "Request/reply calls served", ["subject", "outcome"])


BUS_CONSUMER_PENDING = Gauge(
    "gpupool_bus_consumer_pending", "Messages in the stream not yet delivered to a durable consumer (its lag)",
    ["consumer"],
)
BUS_CONSUMER_ACK_PENDING = Gauge(
    "gpupool_bus_consumer_ack_pending", "Messages delivered to a durable consumer and not yet acknowledged", ["consumer"]
)
BUS_REDELIVERIES = Counter(
    "gpupool_bus_redeliveries_total", "Messages a consumer received again (not acknowledged in time, or nak'd)",
    ["consumer"],
)

# --- scheduling (placement) ------------------------------------------------------------------------------------
CYCLE_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
SCHEDULING_CYCLE_SECONDS = Histogram(
    "gpupool_scheduling_cycle_seconds", "Time of one scheduling cycle: snapshot, schedule() and applying the plan",
    ["policy"], buckets=CYCLE_BUCKETS,
)
SCHEDULING_PHASE_SECONDS = Histogram(
    "gpupool_scheduling_phase_seconds", "Time of one phase of the core's cycle (from Plan.stats)", ["phase"],
    buckets=CYCLE_BUCKETS,
)
SCHEDULING_CYCLE_PART_SECONDS = Histogram(
    "gpupool_scheduling_cycle_part_seconds", "Time of one part of a scheduling cycle: load (the store's changes read), "
    "build (the kept core's indexes brought up to date), core (the facts, requests and snapshot, then schedule() "
    "in a worker thread: its GIL waits included), store (the plan, reasons, order and decision written and committed)", ["part"], buckets=CYCLE_BUCKETS,
)
SCHEDULING_DECISIONS = Counter(
    "gpupool_scheduling_decisions_total",
    "Decisions of scheduling cycles: units placed, victims preempted, placements the store refused as stale",
    ["outcome"],
)
PENDING_UNITS = Gauge("gpupool_pending_units", "Units (jobs, gangs, replicas) left pending, by reason", ["reason"])
ALLOCATIONS = Gauge("gpupool_allocations", "Live allocations by state (running, preempting)", ["state"])
GPUS_ALLOCATED = Gauge("gpupool_gpus_allocated", "GPUs held by live allocations, shares counted by their share",
                       ["gpu_model"])
POOL_FREE_GPUS = Gauge("gpupool_pool_free_gpus", "Free GPU capacity (a fraction counts its free share) of "
                       "schedulable nodes, per cluster and model", ["cluster", "gpu_model"])
POOL_FRAGMENTED_GPUS = Gauge("gpupool_pool_fragmented_gpus", "Of the free GPU capacity, what a job shape drawn "
                             "from the recent workload could not use (FGD's measure), per cluster and model",
                             ["cluster", "gpu_model"])
QUOTA_USED_GPUS = Gauge("gpupool_quota_used_gpus", "GPUs a team holds (shares counted by their share)",
                        ["team", "gpu_model"])
QUOTA_GUARANTEED_GPUS = Gauge("gpupool_quota_guaranteed_gpus", "GPUs guaranteed to a team by its quota entries",
                              ["team", "gpu_model"])

# --- queue -------------------------------------------------------------------------------------------------------
QUEUE_JOBS = Gauge("gpupool_queue_jobs", "Jobs by team, priority class and state (non-terminal states)",
                   ["team", "priority_class", "state"])
QUEUE_WAIT_SECONDS = Histogram(
    "gpupool_queue_wait_seconds", "From submission (or approval) to the first grant", ["team", "priority_class"],
    buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600, 14400, 86400),
)
JOB_TRANSITIONS = Counter("gpupool_job_transitions_total", "Job state transitions", ["to_state", "reason"])


def serve_metrics(port: int, host: str = "127.0.0.1") -> None:
    """Expose /metrics on its own port (services without a web server)."""
    start_http_server(port, addr=host)
