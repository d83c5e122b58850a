"""Preemption through real processes: decided by the core, acted on by placement with a checkpoint signal and a
grace period, visible on the job (running → preempting → pending, requeued) and explained."""

from __future__ import annotations

import asyncio

import pytest
from support import AllocationWatcher, finish_all, submit, wait_state

from libs.contracts.events import AllocationGranted, AllocationPreempting, AllocationReleased

pytestmark = pytest.mark.e2e
FLEET_NODES = 2
UP_ARGS = ["--fleet", "H100-80GB*8;H100-80GB*8",
           "--env", "placement:PREEMPTION_GRACE_S=1", "--env", "placement:MIN_RUNTIME_S=0"]


async def test_production_inference_preempts_training_of_its_team_and_never_the_reverse(platform) -> None:  # type: ignore[no-untyped-def]
    async with AllocationWatcher(platform.nats_url) as watcher:
        with platform.client() as api:
            finish_all(api)
            training = [submit(api, f"train-{i}", "research", 8) for i in range(2)]
            for job_id in training:
                await watcher.wait_for(AllocationGranted, job_id)
            serving = submit(api, "serve", "research", 8, priority_class="production-inference", kind="inference")

            _, signal_env, signal = await watcher.wait_for_any(AllocationPreempting, training)
            assert signal.reason == "PreemptedByPriority" and signal.preemptor_job_id == serving
            victim = signal.job_id
            assert signal_env.type == "io.gpupool.allocation.preempting.v1"
            preempting = wait_state(api, victim, "preempting", timeout=5)
            assert "checkpoint before" in preempting["message"]
            explained = api.get(f"/v1/jobs/{victim}/explain").json()
            assert explained["placement"]["reason"] == "PreemptedByPriority"
            assert explained["placement"]["preemptor_job_id"] == serving
            waiting = api.get(f"/v1/jobs/{serving}/explain").json()["placement"]
            assert waiting["state"] == "pending" and victim in waiting["preempting_for_it"]

            _, _, released = await watcher.wait_for(AllocationReleased, victim)
            assert released.reason == "PreemptedByPriority"
            held_s = (released.released_at - signal.deadline).total_seconds()
            assert held_s >= -0.05, "the GPUs were taken back before the grace period ended"
            _, _, granted = await watcher.wait_for(AllocationGranted, serving)
            assert granted.node == released.node
            requeued = wait_state(api, victim, "pending")
            assert requeued["attempts"] == 1
            assert [h["to"] for h in api.get(f"/v1/jobs/{victim}").json()["history"]][-3:] == [
                "running", "preempting", "pending"]

            # the reverse: a normal training job never preempts production inference, it waits
            other = next(j for j in training if j != victim)
            api.post(f"/v1/jobs/{other}/complete")
            await watcher.wait_for(AllocationReleased, other)
            await watcher.wait_for(AllocationGranted, victim)  # the requeued job takes the freed node
            late = submit(api, "late-train", "research", 8)
            await asyncio.sleep(3.0)
            assert [d for _, _, d in watcher.events
                    if isinstance(d, AllocationPreempting) and d.job_id == serving] == []
            assert api.get(f"/v1/jobs/{late}").json()["state"] == "pending"
            finish_all(api)


async def test_a_team_over_its_guarantee_gives_back_what_another_team_is_guaranteed(platform) -> None:  # type: ignore[no-untyped-def]
    async with AllocationWatcher(platform.nats_url) as watcher:
        with platform.client() as api:
            finish_all(api)
            for team in ("research", "inference"):
                put = api.put("/v1/quotas", json={"path": f"default/{team}", "gpu_model": "*", "guaranteed": 8})
                assert put.status_code == 200, put.text
            borrowed = [submit(api, f"borrow-{i}", "research", 8) for i in range(2)]  # 16 > its guarantee of 8
            for job_id in borrowed:
                await watcher.wait_for(AllocationGranted, job_id)
            owed = submit(api, "owed", "inference", 8)
            _, _, signal = await watcher.wait_for_any(AllocationPreempting, borrowed)
            assert signal.reason == "ReclaimedForGuarantee" and signal.preemptor_job_id == owed
            await watcher.wait_for(AllocationGranted, owed)
            assert wait_state(api, signal.job_id, "pending")["attempts"] == 1
            audit = api.get("/v1/audit", params={"action": "quota.set"}).json()["items"]
            assert {e["target"] for e in audit} >= {"default/research:*", "default/inference:*"}
            finish_all(api)
