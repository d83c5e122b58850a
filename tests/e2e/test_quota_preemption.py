"""Preemption that makes room within a quota, on a real `gpupool up`: a team at its quota preempts its own
lower-priority work for a higher-priority job (Kueue's withinClusterQueue), a team within its guarantee gets it back
from a borrower even when an org-level quota entry is full, and quota refusals count the GPU model refused, in the
message and as explain's facts."""

from __future__ import annotations

import time

import pytest
from support import AllocationWatcher, finish_all, submit, wait_state

from libs.contracts.events import AllocationGranted, AllocationPreempting, AllocationReleased

pytestmark = pytest.mark.e2e
FLEET_NODES = 3
UP_ARGS = ["--fleet", "H100-80GB*8;H100-80GB*8;L40S*2",
           "--env", "placement:PREEMPTION_GRACE_S=3", "--env", "placement:MIN_RUNTIME_S=0"]


def set_quota(api, path: str, model: str = "*", **body) -> None:  # type: ignore[no-untyped-def]
    put = api.put("/v1/quotas", json={"path": path, "gpu_model": model, **body})
    assert put.status_code == 200, put.text


def drop_quota(api, path: str, model: str = "*") -> None:  # type: ignore[no-untyped-def]
    gone = api.delete("/v1/quotas", params={"path": path, "gpu_model": model})
    assert gone.status_code == 204, gone.text


def explained(api, job_id: str, reason: str, timeout: float = 20) -> dict:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        doc = api.get(f"/v1/jobs/{job_id}/explain").json()["placement"]
        if doc.get("reason") == reason:
            return doc
        time.sleep(0.05)
    raise AssertionError(f"{job_id} never explained as {reason}: {doc}")


async def test_a_high_job_at_its_teams_quota_preempts_its_own_teams_normal_work(platform) -> None:  # type: ignore[no-untyped-def]
    async with AllocationWatcher(platform.nats_url) as watcher:
        with platform.client() as api:
            finish_all(api)
            set_quota(api, "default/research", guaranteed=8, borrowing_limit=0)
            try:
                normal = submit(api, "normal", "research", 8)
                await watcher.wait_for(AllocationGranted, normal)
                # `high` is not preemptible, so it may only use the guarantee, and the team's normal job holds it
                urgent = submit(api, "urgent", "research", 8, priority_class="high")
                _, _, signal = await watcher.wait_for(AllocationPreempting, normal)
                assert signal.reason == "PreemptedWithinQuota" and signal.preemptor_job_id == urgent
                waiting = explained(api, urgent, "Preempting")
                assert "PreemptedWithinQuota" in waiting["message"] and normal in waiting["preempting_for_it"]
                # the same, as data: the victim, why, and the quota that refused it
                facts = waiting["facts"]
                assert facts["victims"] == [{"job_id": normal, "reason": "PreemptedWithinQuota"}], facts
                assert facts["within_quota"] is True and facts["victims_considered"] >= 1, facts
                assert facts["quota"]["path"] == "default/research", facts
                victim = api.get(f"/v1/jobs/{normal}/explain").json()["placement"]
                assert (victim["reason"], victim["preemptor_job_id"]) == ("PreemptedWithinQuota", urgent)
                _, _, released = await watcher.wait_for(AllocationReleased, normal)
                assert released.reason == "PreemptedWithinQuota"
                await watcher.wait_for(AllocationGranted, urgent)
                # requeued, it waits for the quota the high job holds, and says so in GPUs of any model
                assert wait_state(api, normal, "pending")["attempts"] == 1
                refused = explained(api, normal, "QuotaExceeded")
                assert "16 GPU(s) of any model" in refused["message"] and "*" not in refused["message"], refused
                assert refused["facts"]["quota"] == {
                    "path": "default/research", "gpu_model": "*", "rule": "borrowing_limit", "used_gpus": 8,
                    "asked_gpus": 8, "limit_gpus": 8, "guaranteed_gpus": 8}, refused
            finally:
                finish_all(api)
                drop_quota(api, "default/research")


async def test_an_org_quota_entry_does_not_keep_a_teams_guarantee_from_it(platform) -> None:  # type: ignore[no-untyped-def]
    async with AllocationWatcher(platform.nats_url) as watcher:
        with platform.client() as api:
            finish_all(api)
            model = "H100-80GB"
            set_quota(api, "default", model, guaranteed=16)  # the org holds every H100
            for team in ("research", "inference"):
                set_quota(api, f"default/{team}", model, guaranteed=8)
            try:
                borrowed = [submit(api, f"borrow-{i}", "research", 8) for i in range(2)]  # 8 of them inference's
                for job_id in borrowed:
                    await watcher.wait_for(AllocationGranted, job_id)
                owed = submit(api, "owed", "inference", 8)
                _, _, signal = await watcher.wait_for_any(AllocationPreempting, borrowed)
                assert signal.reason == "ReclaimedForGuarantee" and signal.preemptor_job_id == owed
                await watcher.wait_for(AllocationGranted, owed)
                assert wait_state(api, signal.job_id, "pending")["attempts"] == 1
            finally:
                finish_all(api)
                for path in ("default/research", "default/inference", "default"):
                    drop_quota(api, path, model)


def test_a_quota_refusal_counts_only_the_model_it_refuses(platform) -> None:  # type: ignore[no-untyped-def]
    with platform.client() as api:
        finish_all(api)
        set_quota(api, "default/research", "H100-80GB", guaranteed=6)
        try:
            h100 = api.post("/v1/jobs", json={"name": "h100", "team": "research", "gpus": 6,
                                              "gpu_models": ["H100-80GB"]})
            assert h100.status_code == 201, h100.text
            wait_state(api, h100.json()["job_id"], "running")
            # not preemptible, no L40S guarantee: it waits, and the 6 H100 in use are not counted as L40S
            l40s = api.post("/v1/jobs", json={"name": "l40s", "team": "research", "gpus": 1, "gpu_models": ["L40S"],
                                              "priority_class": "high"})
            assert l40s.status_code == 201, l40s.text
            refused = explained(api, l40s.json()["job_id"], "QuotaExceeded")
            assert "(0 L40S GPU(s), 0 in use)" in refused["message"], refused
            # explain's facts carry the refusal's numbers: no parsing of the message
            facts = refused["facts"]
            assert facts["cause"] == "quota" and "L40S" in facts["ask"], facts
            assert facts["quota"] == {"path": "default/research", "gpu_model": "L40S", "rule": "guarantee_only",
                                      "used_gpus": 0, "asked_gpus": 1, "limit_gpus": 0, "guaranteed_gpus": 0}, facts
        finally:
            finish_all(api)
            drop_quota(api, "default/research", "H100-80GB")
