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
RPC_REQUESTS = Counter("gpupool_rpc_requests_total", "Request/reply calls served", ["subject", "outcome"])


def serve_metrics(port: int, host: str = "127.0.0.1") -> None:
    """Expose /metrics on its own port (services without a web server)."""
    start_http_server(port, addr=host)
