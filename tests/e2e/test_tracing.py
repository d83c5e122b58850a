"""Traces an SRE can follow, against a real OTLP/HTTP receiver (tests/otlp_receiver.py) fed by the real exporter of
every process (`gpupool up --otlp-endpoint`): one submission is one trace across gateway, quota, queue and
placement; a job that runs is one connected trace from its submission through the agent's launch and exit to its
completion, accounting and inventory included, with its id on `GET /v1/jobs/{id}`; and an idle platform exports
(almost) nothing: background loops record no spans (docs/ecosystem.md, "Traces: OTLP")."""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Iterator

import nats
import pytest
from support import eventually, finish_all, submit, wait_state

from libs.contracts import subjects
from libs.observability.tracing import remote_parent
from tests.otlp_receiver import OtlpReceiver, breakdown

pytestmark = pytest.mark.e2e

_receiver = OtlpReceiver()
# the documented flag: every process exports there; a quick preemption for the preempted job's trace
UP_ARGS = ["--otlp-endpoint", _receiver.endpoint,
           "--env", "placement:PREEMPTION_GRACE_S=1", "--env", "placement:MIN_RUNTIME_S=0"]
# The SDK's batch processor settings pass through `gpupool up` to every process: export quickly.
SDK_ENV = {"OTEL_BSP_SCHEDULE_DELAY": "200"}
# What an idle platform (4 simulated nodes × 8 GPUs, telemetry every 0.5 s) may export: background loops are
# silent, so the bound is what a scrape or a health check might still draw. Before: ~110 spans/s.
IDLE_SPANS_PER_S = 0.5


@pytest.fixture(scope="module", autouse=True)
def otlp_env() -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in SDK_ENV}
    os.environ.update(SDK_ENV)
    yield
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


def _closed_trace(trace_id: str, done, timeout: float = 60) -> list[dict]:  # type: ignore[no-untyped-def]
    """The trace's spans once `done(spans)` holds and no span's parent is missing (spans arrive in per-process
    batches, a parent often after its children). The wait ends as soon as it holds; the generous bound is for a
    loaded CI machine, where one of these once took longer than 20 s."""
    deadline = time.monotonic() + timeout
    spans = _receiver.trace(trace_id)
    while time.monotonic() < deadline:
        spans = _receiver.trace(trace_id)
        ids = {s["span_id"] for s in spans}
        if done(spans) and all(s["parent"] is None or s["parent"] in ids for s in spans):
            break
        time.sleep(0.2)
    return spans


def _roots(spans: list[dict]) -> list[dict]:
    ids = {s["span_id"] for s in spans}
    return [s for s in spans if s["parent"] is None or s["parent"] not in ids]


def test_one_submission_is_one_trace_across_gateway_quota_queue_and_placement(otlp_env, platform) -> None:  # type: ignore[no-untyped-def]
    with platform.client() as api:
        response = api.post("/v1/jobs", json={"name": "traced", "team": "research", "gpus": 1})
        assert response.status_code == 201
        trace_id = response.headers["traceparent"].split("-")[1]
        job_id = response.json()["job_id"]
        assert response.json()["trace_id"] == trace_id
        deadline = time.monotonic() + 30
        while api.get(f"/v1/jobs/{job_id}").json()["state"] != "running" and time.monotonic() < deadline:
            time.sleep(0.1)

    wanted = {"gpupool-gateway", "gpupool-quota", "gpupool-queue", "gpupool-placement"}
    spans = _closed_trace(trace_id, lambda spans: wanted <= {s["service"] for s in spans}
                          and any(s["name"] == "place job" for s in spans))
    services = {s["service"] for s in spans}
    assert wanted <= services, f"services in the trace: {sorted(services)}"
    assert [r["service"] for r in _roots(spans)] == ["gpupool-gateway"], f"roots: {_roots(spans)}"
    names = {(s["service"], s["name"]) for s in spans}
    assert ("gpupool-quota", "serve gpupool.cmd.quota.admit") in names
    assert ("gpupool-queue", "serve gpupool.cmd.queue.submit_job") in names
    assert ("gpupool-placement", "consume gpupool.job.submitted") in names
    assert ("gpupool-placement", "place job") in names
    # database calls are spans too, inside the operation that made them: the queue's insert of the job, and
    # placement's insert of the allocation in the transaction of `place job`
    by_id = {s["span_id"]: s for s in spans}
    db = [s for s in spans if s["scope"] == "gpupool.store"]
    assert any(s["service"] == "gpupool-queue" and s["name"].startswith("INSERT ") for s in db), sorted(names)
    placed = [s for s in db if s["service"] == "gpupool-placement" and s["name"].startswith("INSERT ")
              and by_id[s["parent"]]["name"] == "place job"]
    assert placed, sorted(n for n in names if n[0] == "gpupool-placement")


def test_a_job_that_runs_is_one_connected_trace_from_submission_to_completion(otlp_env, platform) -> None:  # type: ignore[no-untyped-def]
    with platform.client() as api:
        response = api.post("/v1/jobs", json={"name": "traced-run", "team": "research", "gpus": 1,
                                              "command": ["sh", "-c", "sleep 0.3; exit 0"]})
        assert response.status_code == 201, response.text
        job_id = response.json()["job_id"]
        deadline = time.monotonic() + 60
        job = api.get(f"/v1/jobs/{job_id}").json()
        while job["state"] != "completed" and time.monotonic() < deadline:
            time.sleep(0.2)
            job = api.get(f"/v1/jobs/{job_id}").json()
        assert job["state"] == "completed", job
    trace_id = job["trace_id"]  # kept on the job since its submission
    assert trace_id == response.headers["traceparent"].split("-")[1]

    steps = {("gpupool-agent", "launch work"), ("gpupool-agent", "work exited"),
             ("gpupool-queue", "attempt started"), ("gpupool-queue", "attempt ended")}
    crossed = {"gpupool-gateway", "gpupool-quota", "gpupool-queue", "gpupool-placement", "gpupool-agent",
               "gpupool-accounting", "gpupool-inventory", "gpupool-reclamation"}
    spans = _closed_trace(trace_id, lambda spans: steps <= {(s["service"], s["name"]) for s in spans}
                          and crossed <= {s["service"] for s in spans}, timeout=60)
    names = {(s["service"], s["name"]) for s in spans}
    print(f"job trace {trace_id}: {len(spans)} spans from {len({s['service'] for s in spans})} services")
    assert crossed <= {s["service"] for s in spans}, f"missing {crossed - {s['service'] for s in spans}}: " \
                                                     f"{sorted(names)}"
    assert steps <= names, sorted(names)
    # one tree: the gateway's request is the only root, every other span hangs off a span of the same trace
    assert [r["service"] for r in _roots(spans)] == ["gpupool-gateway"], \
        f"roots: {[(r['service'], r['name']) for r in _roots(spans)]}"
    by_id = {s["span_id"]: s for s in spans}
    launch = next(s for s in spans if s["name"] == "launch work")
    assert launch["attributes"]["gpupool.job_id"] == job_id
    assert by_id[launch["parent"]]["service"] == "gpupool-agent"  # the agent applying placement's grant
    # the completion reached the ledger in the same trace
    accounting = sorted({s["name"] for s in spans if s["service"] == "gpupool-accounting"
                         and s["scope"] != "gpupool.store"})
    assert any("allocation.released" in name for name in accounting), accounting


def test_a_preempted_job_keeps_its_trace_linked_to_the_cycle_that_preempted_it(otlp_env, platform) -> None:  # type: ignore[no-untyped-def]
    """The scheduling cycle records nothing, yet the victim's preemption and the agent's stop of its work are spans
    of the victim's trace, the former linked to the (unsampled) cycle's context that decided it."""
    with platform.client() as api:
        victim = submit(api, "traced-victim", "research", 8, gpu_models=["L40S"], command=["sleep", "60"])
        trace_id = wait_state(api, victim, "running", timeout=60)["trace_id"]
        submit(api, "traced-preemptor", "research", 8, priority_class="production-inference", kind="inference",
               gpu_models=["L40S"])
        # `sleep` ends on SIGTERM at once, so `preempting` may last milliseconds: wait for it in the history
        eventually(lambda: any(h["to"] == "preempting" for h in api.get(f"/v1/jobs/{victim}").json()["history"]),
                   "the victim's preemption", timeout=60, interval=0.1)
        steps = {("gpupool-queue", "job preempting"), ("gpupool-agent", "stop work")}
        spans = _closed_trace(trace_id, lambda spans: steps <= {(s["service"], s["name"]) for s in spans})
        finish_all(api)
    names = {(s["service"], s["name"]) for s in spans}
    assert steps <= names, sorted(names)
    assert [r["service"] for r in _roots(spans)] == ["gpupool-gateway"], \
        f"roots: {[(r['service'], r['name']) for r in _roots(spans)]}"
    preempting = next(s for s in spans if s["name"] == "job preempting")
    assert len(preempting["links"]) == 1 and preempting["links"][0][0] != trace_id  # the cycle's trace
    stop = next(s for s in spans if s["name"] == "stop work")
    assert stop["attributes"]["gpupool.reason"] == "PreemptedByPriority"


def test_an_idle_platform_exports_almost_nothing(otlp_env, platform) -> None:  # type: ignore[no-untyped-def]
    """Telemetry flows (4 nodes every 0.5 s), outbox relays and sweeps poll: none of it is a trace."""
    time.sleep(2)  # the previous tests' spans are flushed
    mark = time.monotonic()
    window = 10.0
    time.sleep(window)
    spans = _receiver.since(mark)
    print(f"idle: {len(spans)} spans in {window:.0f} s (bound {IDLE_SPANS_PER_S * window:.0f})\n{breakdown(spans)}")
    assert len(spans) <= IDLE_SPANS_PER_S * window, f"{len(spans)} spans in {window:.0f} s:\n{breakdown(spans)}"
    assert not [s for s in spans if s["scope"] == "gpupool.store" and s["parent"] is None], breakdown(spans)
    with platform.client() as api:  # the telemetry did flow meanwhile: silence is not a stalled fleet
        nodes = api.get("/v1/nodes").json()["items"]
    assert len(nodes) >= 4 and all(n["gpus"][0]["telemetry"] for n in nodes)
    assert _receiver.rejected == 0


async def _last_traceparents(url: str) -> dict[str, str | None]:
    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        out = {}
        for stream, subject in ((subjects.TELEMETRY_STREAM.name, subjects.telemetry("local", "sim-node-0")),
                                (subjects.EVENTS_STREAM.name, subjects.DECISION_CYCLE)):
            msg = await js.get_last_msg(stream, subject)
            out[subject] = json.loads(msg.data).get("traceparent")
        return out
    finally:
        await nc.close()


def test_telemetry_and_decision_cycle_events_carry_a_traceparent(otlp_env, platform) -> None:  # type: ignore[no-untyped-def]
    """The bus contract: every CloudEvent sets `traceparent`. Background work's is valid but unsampled, which is
    why its consumers record nothing (the idle test above)."""
    found = asyncio.run(_last_traceparents(platform.nats_url))
    for subject, traceparent in found.items():
        parent = remote_parent({"traceparent": traceparent}) if traceparent else None
        assert parent is not None, f"{subject}: {traceparent!r}"
        assert not parent.trace_flags.sampled, f"{subject}: {traceparent}"
