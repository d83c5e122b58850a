"""OpenTelemetry tracing. Spans are exported over OTLP/HTTP only when OTEL_EXPORTER_OTLP_ENDPOINT is set, so a
laptop run costs nothing; W3C trace context rides in NATS headers so one trace spans HTTP → queue → placement."""

from __future__ import annotations

import os
from collections.abc import Mapping, MutableMapping

from opentelemetry import context, propagate, trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

_provider: TracerProvider | None = None


def exporting() -> bool:
    """True when spans leave the process (an OTLP endpoint is configured): only then are per-query spans worth
    their cost."""
    return bool(os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))


def setup_tracing(service: str) -> TracerProvider:
    global _provider
    if _provider is not None:
        return _provider
    provider = TracerProvider(resource=Resource.create({"service.name": f"gpupool-{service}"}))
    if exporting():
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)
    _provider = provider
    return provider


def shutdown_tracing() -> None:
    if _provider is not None:
        _provider.shutdown()


def tracer(name: str) -> trace.Tracer:
    return trace.get_tracer(name)


def inject_headers(headers: MutableMapping[str, str]) -> MutableMapping[str, str]:
    """Write the current span's `traceparent` (and `tracestate`) into message headers."""
    propagate.inject(headers)
    return headers


def current_traceparent() -> str | None:
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return carrier.get("traceparent")


def extract_context(headers: Mapping[str, str] | None) -> context.Context:
    return propagate.extract(dict(headers or {}))
