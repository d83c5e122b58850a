"""Waste on a real `gpupool up` with telemetry flowing: a third of the allocations sit idle (simulated dev
notebooks), reclamation takes them back, and once inventory's one-minute rollups have arrived the waste report names
exactly those allocations — not the busy training jobs — with the idle GPU-hours they held."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

import pytest
from support import finish_all, wait_state

pytestmark = pytest.mark.e2e
FLEET_NODES = 1
UP_ARGS = ["--fleet", "L40S*6",
           "--env", "agent:SIM_WORKLOADS=dev=idle,training=training,inference=inference,batch=training",
           "--env", "inventory:MAINTENANCE_INTERVAL_S=1", "--env", "inventory:ROLLUP_LATE_S=2",
           "--env", "reclamation:SWEEP_INTERVAL_S=0.5"]


def submit(api, name: str, team: str, kind: str) -> str:  # type: ignore[no-untyped-def]
    response = api.post("/v1/jobs", json={"name": name, "team": team, "gpus": 1, "kind": kind,
                                          "gpu_models": ["L40S"]})
    assert response.status_code == 201, response.text
    return response.json()["job_id"]


def test_the_waste_report_names_the_idle_third_that_reclamation_took_back(platform) -> None:  # type: ignore[no-untyped-def]
    with platform.client() as api:
        finish_all(api)
        start = datetime.now(UTC) - timedelta(minutes=1)
        assert api.put("/v1/reclaim-policies/dev", json={"idle_after_s": 8, "grace_s": 4,
                                                         "idle_util_pct": 5}).status_code == 200
        busy = [submit(api, f"train-{i}", ("research", "inference")[i % 2], "training") for i in range(4)]
        idle = [submit(api, f"notebook-{i}", ("research", "inference")[i % 2], "dev") for i in range(2)]
        allocation = {job: wait_state(api, job, "running")["allocation_id"] for job in busy + idle}
        for job in idle:  # reclamation returns the idle GPUs ...
            failed = wait_state(api, job, "failed", timeout=60)
            assert "IdleReclaimed" in failed["message"]
        active = api.get("/v1/allocations", params={"active": "true"}).json()["items"]
        assert {a["allocation_id"] for a in active} == {allocation[j] for j in busy}

        # ... and once closed minutes' rollups cover every allocation, the waste report names the idle ones.
        # A training job's first covered minute is diluted: its ramp-up (20 s) and, for a job that started mid-minute,
        # the part of the minute before the job, when the card was free. So wait until the rollups cover at least a
        # full busy minute past that per training job on average before judging how efficient training was.
        deadline = time.monotonic() + 240
        while True:
            eff = api.get("/v1/reports/efficiency", params={"from": start.isoformat(), "group_by": "user,kind",
                                                            "kind": ["training", "dev"]}).json()
            waste = api.get("/v1/reports/waste", params={"from": start.isoformat()}).json()
            covered = {r["kind"]: r["telemetry_coverage_pct"] for r in eff["rows"]}
            training_measured_s = 3600 * sum(r["measured_gpu_hours"] for r in eff["rows"] if r["kind"] == "training")
            named = {a["allocation_id"] for a in waste["idle_allocations"]}
            if training_measured_s >= len(busy) * 120 and named == {allocation[j] for j in idle}:
                break
            assert time.monotonic() < deadline, f"rollups not there yet: {covered} {training_measured_s} s {named}"
            time.sleep(1.0)
        assert named == {allocation[j] for j in idle}, "only the idle third is named"
        for a in waste["idle_allocations"]:
            assert a["kind"] == "dev" and a["release_reason"] == "IdleReclaimed" and not a["running"]
            assert a["idle_fraction"] == 1.0 and a["avg_utilization_pct"] < 5
        assert {t["team"] for t in waste["by_team"] if t["idle_gpu_hours"] > 0} == {"research", "inference"}
        # busy work is efficient and all but never idle; how efficient depends on where the simulated training loop
        # is in its cycle (ramp-up; no checkpoint pause comes in its first 2 minutes), so the bar is "clearly busy".
        # The one idle time training can show is the minute it started in: utilization comes in one-minute rollups,
        # and a job that started late in a minute gets that minute's average, mostly the free card's zero.
        training = next(r for r in eff["rows"] if r["kind"] == "training")
        dev = next(r for r in eff["rows"] if r["kind"] == "dev")
        assert training["idle_gpu_hours"] <= len(busy) * 60 / 3600 and training["efficiency_pct"] > 25
        # every idle GPU-hour in the report is either a named idle session's or that start-minute artefact
        assert waste["idle_gpu_hours"] == pytest.approx(
            sum(a["idle_gpu_hours"] for a in waste["idle_allocations"]) + training["idle_gpu_hours"], abs=1e-5)
        assert dev["efficiency_pct"] < 5 < training["efficiency_pct"]
        for job in busy:
            api.post(f"/v1/jobs/{job}/complete")
