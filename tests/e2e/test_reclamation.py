"""Reclamation through real processes and simulated telemetry: an idle dev job is warned, then reclaimed after its
grace period and its team's quota is free again; a job on a node that goes silent is requeued and runs elsewhere."""

from __future__ import annotations

import asyncio
import json
import time

import nats
import pytest
from support import AllocationWatcher, finish_all, wait_state

from libs.contracts.envelope import parse_envelope
from libs.contracts.events import AllocationGranted, AllocationReleased, decode_data

pytestmark = pytest.mark.e2e
FLEET_NODES = 2
UP_ARGS = ["--fleet", "L40S*4;L40S*4",
           "--env", "agent:SIM_WORKLOADS=dev=idle,training=training,inference=inference,batch=training",
           "--env", "reclamation:SWEEP_INTERVAL_S=0.5", "--env", "inventory:NODE_LOST_AFTER_S=3",
           # a node is lost after 3 s: its agent, sampling by change, must send at least every second
           "--env", "agent:HEARTBEAT_S=1",
           "--env", "inventory:NODE_SWEEP_INTERVAL_S=0.5", "--env", "queue:REQUEUE_BACKOFF_S=2"]


class ReclaimWatcher:
    def __init__(self, url: str) -> None:
        self.url = url
        self.events: list = []

    async def __aenter__(self):  # type: ignore[no-untyped-def]
        self.nc = await nats.connect(self.url)

        async def on_msg(msg) -> None:  # type: ignore[no-untyped-def]
            self.events.append(decode_data(parse_envelope(msg.data)))

        await self.nc.subscribe("gpupool.reclaim.>", cb=on_msg)
        await self.nc.flush()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.nc.close()

    def of(self, type_name: str, job_id: str) -> list:
        return [e for e in self.events if type(e).__name__ == type_name and e.job_id == job_id]


async def test_an_idle_dev_job_is_warned_then_reclaimed_and_its_quota_is_free_again(platform) -> None:  # type: ignore[no-untyped-def]
    async with AllocationWatcher(platform.nats_url) as allocations, ReclaimWatcher(platform.nats_url) as reclaims:
        with platform.client() as api:
            finish_all(api)
            assert api.put("/v1/reclaim-policies/dev", json={"idle_after_s": 2, "grace_s": 2,
                                                             "idle_util_pct": 5}).status_code == 200
            # research may hold exactly one GPU: the second job waits for the first to go
            assert api.put("/v1/quotas", json={"path": "default/research", "guaranteed": 1,
                                               "borrowing_limit": 0}).status_code == 200
            try:
                notebook = api.post("/v1/jobs", json={"name": "notebook", "team": "research", "gpus": 1,
                                                      "kind": "dev"}).json()["job_id"]
                await allocations.wait_for(AllocationGranted, notebook)
                waiting = api.post("/v1/jobs", json={"name": "train", "team": "research", "gpus": 1,
                                                     "kind": "training"}).json()["job_id"]
                deadline = time.monotonic() + 15  # the next scheduling cycle says why it waits
                while api.get(f"/v1/jobs/{waiting}/explain").json()["placement"]["reason"] != "QuotaExceeded":
                    assert time.monotonic() < deadline, api.get(f"/v1/jobs/{waiting}/explain").json()
                    await asyncio.sleep(0.2)

                deadline = time.monotonic() + 30
                while not reclaims.of("ReclaimWarned", notebook):
                    assert time.monotonic() < deadline, "no idle warning"
                    await asyncio.sleep(0.1)
                warned = reclaims.of("ReclaimWarned", notebook)[0]
                assert warned.reason == "IdleTimeout" and warned.idle_s >= 2
                assert allocations.of(AllocationReleased, notebook) == [], "released before the grace period"

                _, _, released = await allocations.wait_for(AllocationReleased, notebook, timeout=30)
                assert released.reason == "IdleReclaimed"
                assert (released.released_at - warned.deadline).total_seconds() >= -0.5
                # reclamation's decision and placement's release travel on different subjects from different
                # services' outboxes: neither is ordered before the other at this watcher
                deadline = time.monotonic() + 10
                while not reclaims.of("ReclaimDecided", notebook):
                    assert time.monotonic() < deadline, "no reclaim decision event"
                    await asyncio.sleep(0.05)
                await asyncio.sleep(0.5)  # a second decision would arrive about as soon
                decided = reclaims.of("ReclaimDecided", notebook)
                assert [d.reason for d in decided] == ["IdleReclaimed"]
                job = wait_state(api, notebook, "failed")
                assert "IdleReclaimed" in job["message"]
                await allocations.wait_for(AllocationGranted, waiting)  # the quota was free again at once
            finally:
                api.put("/v1/quotas", json={"path": "default/research", "guaranteed": 0})
                api.delete("/v1/quotas", params={"path": "default/research", "gpu_model": "*"})
                api.put("/v1/reclaim-policies/dev", json={"idle_after_s": 1800, "grace_s": 300})
                finish_all(api)


async def test_a_job_on_a_node_that_goes_silent_is_requeued_and_runs_elsewhere(platform) -> None:  # type: ignore[no-untyped-def]
    async with AllocationWatcher(platform.nats_url) as allocations, ReclaimWatcher(platform.nats_url) as reclaims:
        with platform.client() as api:
            finish_all(api)
            job_id = api.post("/v1/jobs", json={"name": "long", "team": "research", "gpus": 4,
                                                "kind": "training"}).json()["job_id"]
            _, _, first = await allocations.wait_for(AllocationGranted, job_id)
            nc = await nats.connect(platform.nats_url)
            await nc.publish("gpupool.sim.fault", json.dumps(
                {"node": first.node, "fault": "silence", "seconds": 60}).encode())
            await nc.close()

            _, _, released = await allocations.wait_for(AllocationReleased, job_id, timeout=30)
            assert released.reason == "NodeLost" and released.node == first.node
            assert [d.reason for d in reclaims.of("ReclaimDecided", job_id)] == ["NodeLost"]
            deadline = time.monotonic() + 30
            while len(allocations.of(AllocationGranted, job_id)) < 2:
                assert time.monotonic() < deadline, "the job was not placed again"
                await asyncio.sleep(0.1)
            second = allocations.of(AllocationGranted, job_id)[1][2]
            assert second.node != first.node
            # an abnormal loss backs off before the job is wanted again (QUEUE:REQUEUE_BACKOFF_S, first loss: 1x)
            assert (second.granted_at - released.released_at).total_seconds() >= 2.0
            job = wait_state(api, job_id, "running")
            assert job["attempts"] == 1
            requeued = [h for h in api.get(f"/v1/jobs/{job_id}").json()["history"] if h["to"] == "pending"][-1]
            assert requeued["reason"] == "Requeued:NodeLost"
            assert [h["to"] for h in api.get(f"/v1/jobs/{job_id}").json()["history"]][-3:] == [
                "running", "pending", "running"]
            nodes = {n["node"]: n["state"] for n in api.get("/v1/nodes").json()["items"]}
            assert nodes[first.node] == "lost"
            finish_all(api)


async def test_an_allocated_but_idle_dev_session_shows_as_such_in_the_pool(platform) -> None:  # type: ignore[no-untyped-def]
    """In this fleet simulated dev sessions sit idle on their GPUs: the pool view must say so."""
    async with AllocationWatcher(platform.nats_url) as allocations:
        with platform.client() as api:
            finish_all(api)
            session = api.post("/v1/jobs", json={"name": "idle-notebook", "team": "research", "gpus": 2,
                                                 "kind": "dev", "gpu_models": ["L40S"]}).json()["job_id"]
            await allocations.wait_for(AllocationGranted, session)
            deadline = time.monotonic() + 20
            while True:
                row = {m["model"]: m for m in api.get("/v1/pool").json()["all"]["models"]}["L40S"]
                if row["allocated"] >= 2 and row["allocated_idle"] >= 2:
                    break
                assert time.monotonic() < deadline, row
                await asyncio.sleep(0.2)
            assert row["free"] == row["healthy"] - row["allocated"]
            finish_all(api)
