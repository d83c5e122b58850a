"""No noise, one trace per job (libs.observability.tracing): background work runs in an unsampled context that records
nothing yet still hands a `traceparent` on; a job's later steps are spans of the job's kept trace, linked to the
trace that caused them; database spans are drawn only inside a recorded span."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from libs.observability import tracing
from libs.observability.tracing import background, current_traceparent, job_span, remote_parent, trace_id_of
from libs.store import database

JOB_TRACE, SUBMIT_SPAN = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
KEPT = f"00-{JOB_TRACE}-{SUBMIT_SPAN}-01"


@pytest.fixture
def spans(monkeypatch: pytest.MonkeyPatch) -> InMemorySpanExporter:
    """A provider of the process's kind with an in-memory exporter, as the one `setup_tracing` installs."""
    provider = tracing._Provider()
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    monkeypatch.setattr(tracing, "_provider", provider)
    monkeypatch.setattr(database, "_db_tracer", provider.get_tracer("gpupool.store"))
    return exporter


def _tracer() -> trace.Tracer:
    assert tracing._provider is not None
    return tracing._provider.get_tracer("test")


def _query(query: str = "SELECT 1") -> None:
    database._query_span(SimpleNamespace(query=query, elapsed=0.001, exception=None, conn_addr=("db", 5432),
                                         conn_params=SimpleNamespace(database="gpupool_queue")))


def test_background_work_records_nothing_but_still_hands_on_a_traceparent(spans: InMemorySpanExporter) -> None:
    with background():
        with _tracer().start_as_current_span("scheduling cycle"):
            _query()
            parent = current_traceparent()
    assert spans.get_finished_spans() == ()
    assert parent is not None and parent.endswith("-00")  # valid ids, not sampled: consumers stay silent too
    context = remote_parent({"traceparent": parent})
    assert context is not None and not context.trace_flags.sampled


def test_a_query_is_a_span_only_inside_a_recorded_span(spans: InMemorySpanExporter) -> None:
    _query("BEGIN;")  # a loop's poll outside any span: nothing
    with _tracer().start_as_current_span("serve gpupool.cmd.queue.submit_job") as served:
        _query("INSERT INTO jobs VALUES ($1)")
    finished = {s.name: s for s in spans.get_finished_spans()}
    assert set(finished) == {"serve gpupool.cmd.queue.submit_job", "INSERT gpupool_queue"}
    assert finished["INSERT gpupool_queue"].parent.span_id == served.get_span_context().span_id


def test_a_job_step_caused_elsewhere_joins_the_job_trace_linked_to_its_cause(spans: InMemorySpanExporter) -> None:
    with _tracer().start_as_current_span("complete request") as request:  # another trace: a user's request
        with job_span(_tracer(), "job completed", KEPT, {"gpupool.job_id": "j-1"}):
            _query("UPDATE jobs SET state = $2")
            handed_on = current_traceparent()
    step = next(s for s in spans.get_finished_spans() if s.name == "job completed")
    assert f"{step.context.trace_id:032x}" == JOB_TRACE
    assert f"{step.parent.span_id:016x}" == SUBMIT_SPAN
    assert [link.context.span_id for link in step.links] == [request.get_span_context().span_id]
    assert trace_id_of(handed_on) == JOB_TRACE  # the events it emits continue the job's trace
    query = next(s for s in spans.get_finished_spans() if s.name.startswith("UPDATE"))
    assert query.parent.span_id == step.context.span_id


def test_a_job_step_already_in_the_job_trace_is_a_plain_child(spans: InMemorySpanExporter) -> None:
    parent = trace.NonRecordingSpan(remote_parent({"traceparent": KEPT}))  # type: ignore[arg-type]
    with trace.use_span(parent), _tracer().start_as_current_span("apply grant") as applying:
        with job_span(_tracer(), "launch work", KEPT):
            pass
    step = next(s for s in spans.get_finished_spans() if s.name == "launch work")
    assert step.parent.span_id == applying.get_span_context().span_id and not step.links


def test_a_job_step_from_background_work_is_recorded_in_the_job_trace(spans: InMemorySpanExporter) -> None:
    """A preemption decided by the (silent) scheduling cycle is still a recorded step of the victim's trace."""
    with background(), job_span(_tracer(), "job preempting", KEPT):
        pass
    (step,) = spans.get_finished_spans()
    assert f"{step.context.trace_id:032x}" == JOB_TRACE and step.context.trace_flags.sampled
    assert len(step.links) == 1 and not step.links[0].context.trace_flags.sampled


def test_without_a_kept_trace_a_step_is_a_child_of_the_current_span(spans: InMemorySpanExporter) -> None:
    with _tracer().start_as_current_span("consume") as consuming, job_span(_tracer(), "attempt ended", None):
        pass
    step = next(s for s in spans.get_finished_spans() if s.name == "attempt ended")
    assert step.parent.span_id == consuming.get_span_context().span_id


@pytest.mark.parametrize(("traceparent", "expected"), [
    (KEPT, JOB_TRACE), (None, None), ("", None), ("garbage", None), (f"00-{'0' * 32}-{SUBMIT_SPAN}-01", None)])
def test_the_trace_id_of_a_traceparent(traceparent: str | None, expected: str | None) -> None:
    assert trace_id_of(traceparent) == expected
