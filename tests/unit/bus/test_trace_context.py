"""The platform's own W3C trace-context handling (libs.observability.tracing) against OpenTelemetry's propagator:
the same headers written, the same parents accepted, and non-recording handling spans that continue the trace."""

from __future__ import annotations

import pytest
from opentelemetry import propagate, trace
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from libs.observability import tracing
from libs.observability.tracing import (
    child_span,
    current_traceparent,
    handling_span,
    inject_headers,
    recording,
    remote_parent,
    tracer,
)


@pytest.fixture(autouse=True)
def nothing_listens(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests are about the path taken when no span processor listens; an integration test earlier in the same
    session may have added one to the process's provider."""
    monkeypatch.setattr(tracing, "_provider", None)

TRACE, SPAN = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
W3C = TraceContextTextMapPropagator()


@pytest.mark.parametrize("headers", [
    {"traceparent": f"00-{TRACE}-{SPAN}-01"},
    {"traceparent": f"00-{TRACE}-{SPAN}-00"},
    {"traceparent": f" 00-{TRACE}-{SPAN}-01\t"},
    {"traceparent": f"00-{TRACE}-{SPAN}-01", "tracestate": "vendor=a,other=b"},
    {"traceparent": f"01-{TRACE}-{SPAN}-01-future"},
    {"traceparent": f"00-{TRACE}-{SPAN}-01-extra"},
    {"traceparent": f"ff-{TRACE}-{SPAN}-01"},
    {"traceparent": f"00-{'0' * 32}-{SPAN}-01"},
    {"traceparent": f"00-{TRACE}-{'0' * 16}-01"},
    {"traceparent": f"00-{TRACE.upper()}-{SPAN}-01"},
    {"traceparent": "garbage"},
    {"traceparent": ""},
    {"tracestate": "vendor=a"},
    {},
])
def test_remote_parent_accepts_exactly_what_the_w3c_propagator_accepts(headers: dict[str, str]) -> None:
    expected = trace.get_current_span(W3C.extract(headers)).get_span_context()
    parent = remote_parent(headers)
    if not expected.is_valid:
        assert parent is None
    else:
        assert parent == expected
        assert parent.trace_state == expected.trace_state and parent.is_remote


def test_injected_headers_are_the_propagators() -> None:
    parent = remote_parent({"traceparent": f"00-{TRACE}-{SPAN}-01", "tracestate": "vendor=a,other=b"})
    assert parent is not None
    with trace.use_span(trace.NonRecordingSpan(parent)):
        expected: dict[str, str] = {}
        propagate.inject(expected)
        assert inject_headers({}) == expected == {"traceparent": f"00-{TRACE}-{SPAN}-01",
                                                  "tracestate": "vendor=a,other=b"}
        assert current_traceparent() == expected["traceparent"]
    assert inject_headers({}) == {} and current_traceparent() is None  # no current span: nothing to propagate


@pytest.mark.parametrize("flags", ["01", "00"])
def test_a_handling_span_continues_the_callers_trace_without_recording(flags: str) -> None:
    assert not recording()  # nothing receives spans in the unit tests
    with handling_span(tracer("test"), "consume x", {"traceparent": f"00-{TRACE}-{SPAN}-{flags}"},
                       trace.SpanKind.CONSUMER, {"a": "b"}) as span:
        assert trace.get_current_span() is span and not span.is_recording()
        version, trace_id, span_id, sent_flags = (current_traceparent() or "").split("-")
    assert (version, trace_id, sent_flags) == ("00", TRACE, flags)
    assert span_id not in (SPAN, "0" * 16)
    assert trace.get_current_span() is trace.INVALID_SPAN  # detached again


def test_without_a_caller_each_child_span_starts_a_sampled_trace() -> None:
    first, second = (child_span(h).get_span_context() for h in ({}, {"traceparent": "garbage"}))
    assert first.is_valid and second.is_valid and first.trace_id != second.trace_id
    assert first.trace_flags.sampled and second.trace_flags.sampled
