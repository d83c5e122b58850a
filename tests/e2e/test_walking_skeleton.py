"""The thin slice through real processes: agent → inventory → gateway → queue → placement → allocation event →
queue → complete → release → accounting ledger. Nothing is mocked: real NATS, real PostgreSQL, real processes."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import pytest
from support import AllocationWatcher

from libs.contracts.events import AllocationGranted, AllocationReleased

pytestmark = pytest.mark.e2e

TERMINAL_WAIT_S = 20


def submit(api, **body):  # type: ignore[no-untyped-def]
    payload = {"name": "e2e", "team": "research", "gpus": 1, **body}
    return api.post("/v1/jobs", json=payload)


async def test_submitted_job_is_allocated_and_announced_as_a_cloudevent(platform) -> None:
    async with AllocationWatcher(platform.nats_url) as watcher:
        with platform.client() as api:
            sent = time.monotonic()
            response = submit(api, gpus=2, gpu_models=["H100-80GB"])
            assert response.status_code == 201, response.text
            job_id = response.json()["job_id"]
            received, envelope, data = await watcher.wait_for(AllocationGranted, job_id)
            print(f"submit → allocation.granted observed after {1000 * (received - sent):.1f} ms")

            assert envelope.specversion == "1.0"
            assert envelope.type == "io.gpupool.allocation.granted.v1"
            assert envelope.source == "/gpupool/placement"
            assert envelope.subject == data.allocation_id
            assert data.team == "research" and data.project == "default" and data.cluster == "local"
            assert len(data.gpus) == 2 and all(g.model == "H100-80GB" and g.uuid.startswith("GPU-") for g in data.gpus)
            assert len({g.index for g in data.gpus}) == 2

            job = _wait_job_state(api, job_id, "running")
            assert job["allocation_id"] == data.allocation_id and job["node"] == data.node
            assert [h["to"] for h in job["history"]] == ["pending", "running"]

            allocations = api.get("/v1/allocations", params={"job_id": job_id}).json()["items"]
            assert [a["allocation_id"] for a in allocations] == [data.allocation_id]

            done = api.post(f"/v1/jobs/{job_id}/complete")
            assert done.status_code == 200 and done.json()["state"] == "completed"
            _, released_env, released = await watcher.wait_for(AllocationReleased, job_id)
            assert released.allocation_id == data.allocation_id and released.reason == "JobCompleted"

            usage = _wait_usage(api, job_id)
            assert usage["gpu_count"] == 2 and usage["gpu_model"] == "H100-80GB"
            held = (released.released_at - data.granted_at).total_seconds()
            assert usage["gpu_seconds"] == pytest.approx(2 * held, rel=1e-6)


async def test_one_trace_runs_from_the_http_request_to_the_allocation_event(platform) -> None:
    trace_id = f"{time.time_ns():032x}"[-32:]
    caller = f"00-{trace_id}-{'ab' * 8}-01"
    async with AllocationWatcher(platform.nats_url) as watcher:
        with platform.client() as api:
            response = api.post("/v1/jobs", json={"name": "traced", "team": "research", "gpus": 1},
                                headers={"traceparent": caller})
            assert response.status_code == 201
            assert response.headers["traceparent"].split("-")[1] == trace_id
            _, envelope, _ = await watcher.wait_for(AllocationGranted, response.json()["job_id"])
    assert envelope.traceparent is not None
    assert envelope.traceparent.split("-")[1] == trace_id


async def test_cancelling_a_pending_job_releases_nothing_and_it_never_runs(platform) -> None:
    async with AllocationWatcher(platform.nats_url) as watcher:
        with platform.client() as api:
            response = submit(api, gpus=8, gpu_models=["T4"])  # no T4 in the fleet: stays pending
            job_id = response.json()["job_id"]
            cancelled = api.post(f"/v1/jobs/{job_id}/cancel", json={"reason": "changed my mind"})
            assert cancelled.status_code == 200 and cancelled.json()["state"] == "cancelled"
            again = api.post(f"/v1/jobs/{job_id}/cancel")
            assert again.status_code == 409 and again.json()["reason"] == "JobAlreadyFinished"
            await asyncio.sleep(1.5)
            assert watcher.of(AllocationGranted, job_id) == []


def test_nodes_show_every_simulated_gpu_with_live_telemetry(platform) -> None:
    with platform.client() as api:
        nodes = api.get("/v1/nodes").json()["items"]
    assert len(nodes) == 4
    models = {g["model"] for n in nodes for g in n["gpus"]}
    assert models == {"H100-80GB", "A100-80GB", "H200-141GB", "L40S"}
    assert all(len(n["gpus"]) == 8 for n in nodes)
    for gpu in (g for n in nodes for g in n["gpus"]):
        assert gpu["telemetry"] is not None and gpu["telemetry"]["memory_used_mib"] >= 0
        assert gpu["health"] == "healthy"


def test_same_idempotency_key_returns_the_same_job_and_never_a_second_one(platform) -> None:
    with platform.client() as api:
        key = {"Idempotency-Key": f"e2e-{time.time_ns()}"}
        first = api.post("/v1/jobs", json={"name": "idem", "team": "research", "gpus": 1}, headers=key)
        second = api.post("/v1/jobs", json={"name": "idem", "team": "research", "gpus": 1}, headers=key)
        other = api.post("/v1/jobs", json={"name": "idem", "team": "research", "gpus": 2}, headers=key)
    assert first.status_code == 201 and second.status_code == 200
    assert first.json()["job_id"] == second.json()["job_id"]
    assert other.status_code == 422 and other.json()["reason"] == "IdempotencyKeyReused"


def test_bad_input_and_missing_token_get_problem_details(platform) -> None:
    with platform.client() as api:
        invalid = api.post("/v1/jobs", json={"name": "Bad Name", "team": "research", "gpus": 0})
        unknown_team = submit(api, team="no-such-team")
        missing = api.get("/v1/jobs/does-not-exist")
        anonymous = api.get("/v1/jobs", headers={"Authorization": ""})
    assert invalid.status_code == 422
    assert invalid.headers["content-type"].startswith("application/problem+json")
    assert {tuple(e["loc"]) for e in invalid.json()["errors"]} == {("body", "name"), ("body", "gpus")}
    assert unknown_team.status_code == 422 and unknown_team.json()["reason"] == "UnknownTeam"
    assert missing.status_code == 404 and missing.json()["reason"] == "JobNotFound"
    assert anonymous.status_code == 401 and anonymous.json()["status"] == 401


async def test_placement_killed_with_sigkill_loses_nothing_and_places_each_job_exactly_once(platform) -> None:
    async with AllocationWatcher(platform.nats_url) as watcher:
        with platform.client() as api:
            old_pid = platform.pid("placement")
            os.kill(old_pid, signal.SIGSTOP)  # freeze it so the jobs are accepted but surely not yet placed
            job_ids = [submit(api, name=f"crash-{i}", gpus=1, gpu_models=["A100-80GB"]).json()["job_id"]
                       for i in range(5)]
            os.kill(old_pid, signal.SIGKILL)
            os.kill(old_pid, signal.SIGCONT)
            for job_id in job_ids:
                await watcher.wait_for(AllocationGranted, job_id, timeout=40)
            await asyncio.sleep(2.0)  # time for any duplicate to show up
            assert platform.pid("placement") != old_pid, "the supervisor restarted placement"
            for job_id in job_ids:
                assert len(watcher.of(AllocationGranted, job_id)) == 1
                allocations = api.get("/v1/allocations", params={"job_id": job_id}).json()["items"]
                assert len(allocations) == 1
                assert _wait_job_state(api, job_id, "running")["allocation_id"] == allocations[0]["allocation_id"]
            held = [g["uuid"] for a in api.get("/v1/allocations", params={"active": "true"}).json()["items"]
                    for g in a["gpus"]]
            assert len(held) == len(set(held)), "a GPU is held by two live allocations"


def _wait_job_state(api, job_id: str, state: str) -> dict:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + TERMINAL_WAIT_S
    while time.monotonic() < deadline:
        job = api.get(f"/v1/jobs/{job_id}").json()
        if job["state"] == state:
            return job
        time.sleep(0.05)
    raise AssertionError(f"job {job_id} never became {state}: {job}")


def _wait_usage(api, job_id: str) -> dict:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + TERMINAL_WAIT_S
    while time.monotonic() < deadline:
        items = api.get("/v1/usage", params={"job_id": job_id}).json()["items"]
        if items:
            return items[0]
        time.sleep(0.05)
    raise AssertionError(f"no ledger row for job {job_id}")
