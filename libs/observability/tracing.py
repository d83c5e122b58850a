"""OpenTelemetry tracing. Spans are exported over OTLP/HTTP only when OTEL_EXPORTER_OTLP_ENDPOINT is set, so a
laptop run costs nothing; W3C trace context rides in NATS headers so one trace spans HTTP → queue → placement.

The platform propagates W3C trace context only (`traceparent`, `tracestate`): it builds and reads those headers
itself, which costs a fraction of the general propagator on every message. When no span processor listens
(`recording()` is False), handled messages and requests run in a non-recording span that carries the same trace
context (the caller's trace id and flags, a new span id), so ids continue end to end without the SDK building,
timing and dropping a span object each time.

No noise: work that no request or message started (loops, sweeps, the outbox relay, telemetry sampling) runs in
`background()`, an *unsampled* trace context. The SDK's default sampler (parent-based) records no span under it,
database spans are drawn only inside a recording span (libs/store/database.py), and whatever such work publishes
still carries a `traceparent` (sampled flag off), so its consumers stay silent too. A job's spans are recorded
because they continue the job's own trace (kept on the job, see services/queue)."""

from __future__ import annotations

import os
import random
import re
from collections.abc import Mapping, MutableMapping
from typing import Any

from opentelemetry import context, propagate, trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

_provider: _Provider | None = None


class _Provider(TracerProvider):
    """Knows whether anything receives its spans: an OTLP exporter, or a processor a test added in-process."""

    listened = False

    def add_span_processor(self, span_processor: SpanProcessor) -> None:
        super().add_span_processor(span_processor)
        self.listened = True


def exporting() -> bool:
    """True when spans leave the process (an OTLP endpoint is configured): only then are per-query spans worth
    their cost."""
    return bool(os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))


def recording() -> bool:
    """True when finished spans go somewhere (the provider set up here has a span processor): only then are the
    SDK's span objects worth building for every message and request."""
    return _provider is not None and _provider.listened


def setup_tracing(service: str) -> TracerProvider:
    global _provider
    if _provider is not None:
        return _provider
    provider = _Provider(resource=Resource.create({"service.name": f"gpupool-{service}"}))
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
    """Write the current span's `traceparent` (and `tracestate`) into message headers, as the W3C propagator
    does: nothing when there is no valid current span."""
    ctx = trace.get_current_span().get_span_context()
    if ctx.is_valid:
        headers["traceparent"] = _format(ctx)
        if ctx.trace_state:
            headers["tracestate"] = ctx.trace_state.to_header()
    return headers


def background() -> _Current:
    """Run a `with` block (and every task created inside it) in a new unsampled trace context: see the module's
    docstring. Valid ids, so a published event still has a `traceparent`; flags 00, so nothing under it records."""
    return _Current(trace.NonRecordingSpan(trace.SpanContext(
        _ids.getrandbits(128) or 1, _ids.getrandbits(64) or 1, is_remote=False,
        trace_flags=trace.TraceFlags(trace.TraceFlags.DEFAULT))))


def enter_background() -> None:
    """Make `background()` the ambient context of the running task from now on (a process's main task, once
    tracing is set up): every loop it starts afterwards inherits it."""
    background().__enter__()


def in_recorded_span() -> bool:
    """True when the current span is being recorded: only then is a database call worth its own span."""
    return trace.get_current_span().is_recording()


def current_traceparent() -> str | None:
    ctx = trace.get_current_span().get_span_context()
    return _format(ctx) if ctx.is_valid else None


def _format(ctx: trace.SpanContext) -> str:
    return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{ctx.trace_flags:02x}"


def extract_context(headers: Mapping[str, str] | None) -> context.Context:
    return propagate.extract(dict(headers or {}))


# The W3C propagator's rules for an acceptable traceparent (version ff and all-zero ids are invalid; version 00
# has exactly four fields).
_TRACEPARENT = re.compile(r"^[ \t]*([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?[ \t]*$")
_ids = random.Random()  # span and trace ids, as the SDK's generator makes them (not a secret)


def remote_parent(headers: Mapping[str, str] | None) -> trace.SpanContext | None:
    """The caller's span context from `traceparent`/`tracestate` headers, or None when absent or invalid."""
    value = headers.get("traceparent") if headers else None
    if not value:
        return None
    match = _TRACEPARENT.match(value)
    if match is None:
        return None
    version, trace_hex, span_hex, flags, rest = match.groups()
    if version == "ff" or (version == "00" and rest) or trace_hex == "0" * 32 or span_hex == "0" * 16:
        return None
    state = headers.get("tracestate") if headers else None
    return trace.SpanContext(int(trace_hex, 16), int(span_hex, 16), is_remote=True,
                             trace_flags=trace.TraceFlags(int(flags, 16)),
                             trace_state=trace.TraceState.from_header([state]) if state is not None else None)


def child_span(headers: Mapping[str, str] | None) -> trace.Span:
    """A non-recording span continuing the caller's trace from `headers` (a new sampled trace when there is none):
    what the SDK would propagate for a child span, without building one."""
    parent = remote_parent(headers)
    if parent is not None:
        trace_id, flags, state = parent.trace_id, parent.trace_flags, parent.trace_state
    else:
        trace_id, flags, state = _ids.getrandbits(128) or 1, trace.TraceFlags(trace.TraceFlags.SAMPLED), None
    return trace.NonRecordingSpan(trace.SpanContext(trace_id, _ids.getrandbits(64) or 1, is_remote=False,
                                                    trace_flags=flags, trace_state=state))


class _Current:
    """Makes a span current for a `with` block (what `trace.use_span` does, without its generator machinery)."""

    __slots__ = ("span", "token")

    def __init__(self, span: trace.Span) -> None:
        self.span = span

    def __enter__(self) -> trace.Span:
        self.token = context.attach(trace.set_span_in_context(self.span))
        return self.span

    def __exit__(self, *exc: object) -> None:
        context.detach(self.token)


def handling_span(tr: trace.Tracer, name: str, headers: Mapping[str, str] | None, kind: trace.SpanKind,
                  attributes: dict[str, Any] | None = None) -> Any:
    """The span one handled message or request runs in, as the current span of a `with` block: a recorded child of
    the caller's trace context in `headers` when spans go somewhere (`recording()`), else `child_span`."""
    if recording():
        return tr.start_as_current_span(name, context=extract_context(headers), kind=kind, attributes=attributes)
    return _Current(child_span(headers))


def job_span(tr: trace.Tracer, name: str, traceparent: str | None, attributes: dict[str, Any] | None = None) -> Any:
    """A step of one job's life (an attempt's launch or stop, a completion, a preemption) as a span in the job's
    own trace, `traceparent` being the one kept with the job since its submission; linked to the current span when
    that one belongs to another trace (the scheduling cycle that preempted it, the request that completed it).
    Without a kept traceparent the step is a child of the current span, as any other."""
    parent = remote_parent({"traceparent": traceparent}) if traceparent else None
    if parent is None:
        return tr.start_as_current_span(name, attributes=attributes) if recording() else _Current(
            trace.get_current_span())
    if not recording():
        return _Current(child_span({"traceparent": traceparent}))
    current = trace.get_current_span().get_span_context()
    if current.is_valid and current.trace_id == parent.trace_id:  # already in the job's trace: a plain child
        return tr.start_as_current_span(name, attributes=attributes)
    links = [trace.Link(current)] if current.is_valid else None
    return tr.start_as_current_span(name, context=trace.set_span_in_context(trace.NonRecordingSpan(parent)),
                                    links=links, attributes=attributes)


def trace_id_of(traceparent: str | None) -> str | None:
    """The trace id (32 hex digits) a `traceparent` names, or None."""
    parent = remote_parent({"traceparent": traceparent}) if traceparent else None
    return f"{parent.trace_id:032x}" if parent is not None else None
