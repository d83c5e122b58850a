"""GPU health, faults and node operations through a real `gpupool up` (every service its own process, simulated
agent fleet): an Xid storm quarantines a GPU that returns after probation; a GPU that falls off the bus under a job
is quarantined, the job released (GpuQuarantined) and requeued elsewhere, and never placed on again until it
recovers; an ECC storm and a single ECC burst; cordon and drain by an operator (drained jobs requeue, then fail past
the restart limit); orphans; one-minute rollups on their own stream."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from typing import Any

import httpx
import nats
import pytest
from support import AllocationWatcher, finish_all

from libs.contracts.envelope import parse_envelope
from libs.contracts.events import AllocationGranted, AllocationReleased, decode_data

pytestmark = pytest.mark.e2e
FLEET_NODES = 2
NODES = ("sim-node-0", "sim-node-1")
UP_ARGS = ["--fleet", "L40S*4;L40S*4",
           "--env", "inventory:NODE_LOST_AFTER_S=4", "--env", "agent:HEARTBEAT_S=1",  # under half of it
           "--env", "inventory:STRIKE_GAP_S=1",
           "--env", "inventory:SUSPECT_STRIKES=3", "--env", "inventory:SUSPECT_CLEAR_S=3",
           "--env", "inventory:RECHECK_AFTER_S=3", "--env", "inventory:PROBATION_S=3",
           "--env", "inventory:MAINTENANCE_INTERVAL_S=1", "--env", "inventory:ROLLUP_LATE_S=2",
           "--env", "inventory:ORPHAN_PROCESS_AFTER_S=2", "--env", "inventory:ORPHAN_NO_PROCESS_AFTER_S=3",
           "--env", "reclamation:SWEEP_INTERVAL_S=0.5", "--env", "reclamation:MAX_ABNORMAL_RESTARTS=1",
           "--env", "queue:REQUEUE_BACKOFF_S=0.5",
           "--env", "agent:SIM_WORKLOADS=dev=dev,training=training,inference=inference,batch=training"]


class Watcher:
    """A plain core-NATS subscriber on the subjects a test cares about, decoding every CloudEvent."""

    def __init__(self, url: str, *subjects: str) -> None:
        self.url, self.subjects = url, subjects
        self.events: list[tuple[str, Any]] = []

    async def __aenter__(self) -> Watcher:
        self.nc = await nats.connect(self.url)

        async def on_msg(msg) -> None:  # type: ignore[no-untyped-def]
            self.events.append((msg.subject, decode_data(parse_envelope(msg.data))))

        for subject in self.subjects:
            await self.nc.subscribe(subject, cb=on_msg)
        await self.nc.flush()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.nc.close()

    def of(self, type_name: str, where: Callable[[Any], bool] = lambda _e: True) -> list:
        return [e for _, e in self.events if type(e).__name__ == type_name and where(e)]

    async def wait(self, type_name: str, where: Callable[[Any], bool] = lambda _e: True, n: int = 1,
                   timeout: float = 30) -> list:
        deadline = time.monotonic() + timeout
        while len(found := self.of(type_name, where)) < n:
            assert time.monotonic() < deadline, f"no {n} × {type_name} within {timeout}s: {self.events[-8:]}"
            await asyncio.sleep(0.05)
        return found


async def fault(platform, node: str, kind: str, gpu: int | None = None, **options: Any) -> None:  # type: ignore[no-untyped-def]
    nc = await nats.connect(platform.nats_url)
    await nc.publish("gpupool.sim.fault", json.dumps({"node": node, "fault": kind, "gpu": gpu, **options}).encode())
    await nc.flush()
    await nc.close()


def states(watch: Watcher, uuid: str) -> list[str]:
    return [e.state for e in watch.of("GpuHealthChanged", lambda e: e.gpu_uuid == uuid)]


def gpu_of(api: httpx.Client, node: str, index: int) -> dict:
    return api.get(f"/v1/nodes/{node}").json()["gpus"][index]


@pytest.fixture(scope="module")
def operator(platform) -> httpx.Client:  # type: ignore[no-untyped-def]
    with platform.client() as admin:
        response = admin.post("/v1/tokens", json={"name": "ops-e2e", "role": "operator", "team": None})
        assert response.status_code == 201, response.text
        token = response.json()["token"]
    with httpx.Client(base_url=platform.gateway, timeout=10, headers={"Authorization": f"Bearer {token}"}) as c:
        yield c


async def test_an_xid_storm_quarantines_a_gpu_that_returns_to_the_pool_after_probation(platform) -> None:  # type: ignore[no-untyped-def]
    async with Watcher(platform.nats_url, "gpupool.gpu.>") as watch:
        with platform.client() as api:
            uuid = gpu_of(api, NODES[0], 3)["uuid"]
            await fault(platform, NODES[0], "xid_storm", gpu=3, seconds=4, xid=31)
            (quarantined,) = await watch.wait("GpuHealthChanged", lambda e: e.gpu_uuid == uuid
                                              and e.state == "quarantined")
            assert (quarantined.reason, quarantined.current) == ("RepeatedSuspect", "failed")
            assert states(watch, uuid) == ["suspect", "quarantined"]
            shown = gpu_of(api, NODES[0], 3)
            assert (shown["state"], shown["state_reason"], shown["health"]) == ("quarantined", "RepeatedSuspect",
                                                                                "failed")
            pool = {m["model"]: m for m in api.get("/v1/pool").json()["all"]["models"]}["L40S"]
            assert pool["quarantined"] == 1 and pool["healthy"] == 7 and pool["free"] <= 7

            # the storm ends; clean for the recheck window → probation; clean through probation → healthy
            await watch.wait("GpuHealthChanged", lambda e: e.gpu_uuid == uuid and e.state == "healthy", timeout=40)
            assert states(watch, uuid) == ["suspect", "quarantined", "probation", "healthy"]
            assert [e.reason for e in watch.of("GpuHealthChanged", lambda e: e.gpu_uuid == uuid)][2:] == [
                "RecheckPassed", "ProbationPassed"]
            assert gpu_of(api, NODES[0], 3)["state"] == "healthy"


async def test_a_gpu_off_the_bus_under_a_job_is_quarantined_and_the_job_requeued_elsewhere(platform,  # type: ignore[no-untyped-def]
                                                                                           operator) -> None:
    async with AllocationWatcher(platform.nats_url) as allocations, \
            Watcher(platform.nats_url, "gpupool.gpu.>", "gpupool.reclaim.>") as watch:
        with platform.client() as api:
            finish_all(api)
            job_id = api.post("/v1/jobs", json={"name": "offbus", "team": "research", "gpus": 4,
                                                "kind": "training"}).json()["job_id"]
            _, _, first = await allocations.wait_for(AllocationGranted, job_id)
            broken = first.gpus[1]
            await fault(platform, first.node, "off_bus", gpu=broken.index)

            (event,) = await watch.wait("GpuHealthChanged", lambda e: e.gpu_uuid == broken.uuid)
            assert (event.state, event.reason) == ("quarantined", "GpuLost")
            _, _, released = await allocations.wait_for(AllocationReleased, job_id)
            assert released.reason == "GpuQuarantined"
            # reclamation's relay and placement's publish independently: the release may be seen first
            (decided,) = await watch.wait("ReclaimDecided", lambda e: e.job_id == job_id, timeout=10)
            assert decided.attempt == 1 and "quarantined" in decided.message
            deadline = time.monotonic() + 30
            while len(allocations.of(AllocationGranted, job_id)) < 2:
                assert time.monotonic() < deadline, "the job was not placed again"
                await asyncio.sleep(0.1)
            second = allocations.of(AllocationGranted, job_id)[1][2]
            assert second.node != first.node and broken.uuid not in {g.uuid for g in second.gpus}
            job = api.get(f"/v1/jobs/{job_id}").json()
            assert job["attempts"] == 1 and "Requeued:GpuQuarantined" in [h["reason"] for h in job["history"]]

            # three GPUs are left on the first node: a 3-GPU job goes there, never onto the broken one
            small = api.post("/v1/jobs", json={"name": "small", "team": "research", "gpus": 3,
                                               "kind": "training"}).json()["job_id"]
            _, _, placed = await allocations.wait_for(AllocationGranted, small)
            assert placed.node == first.node and broken.uuid not in {g.uuid for g in placed.gpus}
            blocked = api.post("/v1/jobs", json={"name": "blocked", "team": "research", "gpus": 1,
                                                 "kind": "training"}).json()["job_id"]
            await asyncio.sleep(2)
            assert allocations.of(AllocationGranted, blocked) == []  # 8 GPUs, 7 held, 1 quarantined
            assert api.get(f"/v1/jobs/{blocked}").json()["state"] == "pending"

            # an operator clears it while it is still off the bus: probation fails at once
            cleared = operator.post(f"/v1/nodes/{first.node}/gpus/{broken.index}/health",
                                    json={"action": "clear", "reason": "try again"})
            assert cleared.status_code == 200 and cleared.json()["state"] == "probation", cleared.text
            await watch.wait("GpuHealthChanged", lambda e: e.gpu_uuid == broken.uuid and e.reason == "FailedProbation")
            # a reset brings it back through probation, and the waiting job gets it
            await fault(platform, first.node, "reset", gpu=broken.index)
            _, _, got = await allocations.wait_for(AllocationGranted, blocked, timeout=40)
            assert [g.uuid for g in got.gpus] == [broken.uuid]
            assert states(watch, broken.uuid)[-2:] == ["probation", "healthy"]
            finish_all(api)


async def test_an_ecc_storm_quarantines_and_a_single_ecc_burst_only_makes_a_gpu_suspect(platform) -> None:  # type: ignore[no-untyped-def]
    async with Watcher(platform.nats_url, "gpupool.gpu.>") as watch:
        with platform.client() as api:
            storm, burst = gpu_of(api, NODES[1], 2)["uuid"], gpu_of(api, NODES[1], 0)["uuid"]
            await fault(platform, NODES[1], "ecc_storm", gpu=2)
            await fault(platform, NODES[1], "ecc_burst", gpu=0, count=40)
            # Xid 92 at once makes it suspect; the agent's smoothed error rate then reports the storm on every
            # sample (after a few seconds, during which it may briefly count as healthy again) → quarantined
            await watch.wait("GpuHealthChanged", lambda e: e.gpu_uuid == storm and e.state == "quarantined",
                             timeout=60)
            moves = watch.of("GpuHealthChanged", lambda e: e.gpu_uuid == storm)
            assert (moves[0].state, moves[0].reason) == ("suspect", "NonFatalXid")
            assert (moves[-1].state, moves[-1].reason) == ("quarantined", "RepeatedSuspect")
            assert moves[-1].reasons[0] == "EccStorm"  # the warning that made the last strike
            assert any(r.startswith("sbe_storm:") for r in moves[-1].reasons)
            first = (await watch.wait("GpuHealthChanged", lambda e: e.gpu_uuid == burst))[0]
            assert (first.state, first.reason) == ("suspect", "EccBurst")
            await watch.wait("GpuHealthChanged", lambda e: e.gpu_uuid == burst and e.state == "healthy")
            assert states(watch, burst) == ["suspect", "healthy"]
            assert watch.of("GpuHealthChanged", lambda e: e.gpu_uuid == burst)[-1].reason == "SuspectCleared"
            await fault(platform, NODES[1], "reset", gpu=2)
            await watch.wait("GpuHealthChanged", lambda e: e.gpu_uuid == storm and e.state == "healthy", timeout=40)


async def test_cordon_and_drain_by_an_operator_and_a_job_failed_past_the_restart_limit(platform,  # type: ignore[no-untyped-def]
                                                                                       operator) -> None:
    async with AllocationWatcher(platform.nats_url) as allocations, \
            Watcher(platform.nats_url, "gpupool.node.>", "gpupool.reclaim.>") as watch:
        with platform.client() as api:
            finish_all(api)
            member = api.post("/v1/tokens", json={"name": "m", "role": "member", "team": "research"}).json()["token"]
            with httpx.Client(base_url=platform.gateway, timeout=10,
                              headers={"Authorization": f"Bearer {member}"}) as m:
                refused = m.post(f"/v1/nodes/{NODES[0]}/cordon", json={"reason": "nope"})
                assert refused.status_code == 403 and refused.json()["reason"] == "Forbidden"
                assert m.get(f"/v1/nodes/{NODES[0]}").status_code == 200

            cordoned = operator.post(f"/v1/nodes/{NODES[0]}/cordon", json={"reason": "kernel upgrade"})
            assert cordoned.status_code == 200 and cordoned.json()["cordoned"], cordoned.text
            await watch.wait("NodeCordoned", lambda e: e.node == NODES[0] and not e.drain)
            jobs = [api.post("/v1/jobs", json={"name": f"c{i}", "team": "research", "gpus": 4,
                                               "kind": "training"}).json()["job_id"] for i in range(2)]
            _, _, placed = await allocations.wait_for_any(AllocationGranted, jobs)
            assert placed.node == NODES[1]
            waiting = next(j for j in jobs if j != placed.job_id)
            await asyncio.sleep(2)
            assert allocations.of(AllocationGranted, waiting) == [], "placed on the cordoned node"
            pool = api.get("/v1/pool").json()["all"]["totals"]
            assert pool["cordoned"] == 4

            # uncordon: the waiting job lands there
            assert operator.post(f"/v1/nodes/{NODES[0]}/uncordon").json()["cordoned"] is False
            _, _, second = await allocations.wait_for(AllocationGranted, waiting)
            assert second.node == NODES[0]
            finish_all(api)

            mover = api.post("/v1/jobs", json={"name": "mover", "team": "research", "gpus": 4,
                                               "kind": "training"}).json()["job_id"]
            _, _, at = await allocations.wait_for(AllocationGranted, mover)
            other = NODES[1] if at.node == NODES[0] else NODES[0]
            drained = operator.post(f"/v1/nodes/{at.node}/drain", json={"reason": "rack swap"})
            assert drained.status_code == 200 and drained.json()["drained"], drained.text
            _, _, gone = await allocations.wait_for(AllocationReleased, mover)
            assert gone.reason == "Drained"
            deadline = time.monotonic() + 30
            while len(allocations.of(AllocationGranted, mover)) < 2:
                assert time.monotonic() < deadline, "the drained job was not placed again"
                await asyncio.sleep(0.1)
            assert allocations.of(AllocationGranted, mover)[1][2].node == other
            assert api.get(f"/v1/jobs/{mover}").json()["attempts"] == 1

            # drained again where it went: its second abnormal loss is past the limit (MAX_ABNORMAL_RESTARTS=1), so
            # it is failed, not requeued
            assert operator.post(f"/v1/nodes/{at.node}/uncordon").status_code == 200
            assert operator.post(f"/v1/nodes/{other}/drain").status_code == 200
            deadline = time.monotonic() + 30
            while len(allocations.of(AllocationReleased, mover)) < 2:
                assert time.monotonic() < deadline, "the second drain released nothing"
                await asyncio.sleep(0.1)
            assert allocations.of(AllocationReleased, mover)[1][2].reason == "RestartLimitReached"
            deadline = time.monotonic() + 20
            while (job := api.get(f"/v1/jobs/{mover}").json())["state"] != "failed":
                assert time.monotonic() < deadline, job
                time.sleep(0.1)
            assert "RestartLimitReached" in job["message"]
            # reclamation's decisions travel on its own publisher: the job's state can be read before the second
            # one reaches this watcher
            await watch.wait("ReclaimDecided", lambda e: e.job_id == mover, n=2)
            assert [d.attempt for d in watch.of("ReclaimDecided", lambda e: e.job_id == mover)] == [1, 2]
            assert operator.post(f"/v1/nodes/{other}/uncordon").status_code == 200
            audit = [e["action"] for e in api.get("/v1/audit", params={"limit": 50}).json()["items"]]
            assert {"node.cordon", "node.uncordon", "node.drain", "gpu.clear"} <= set(audit)


async def test_orphans_are_reported_and_listed(platform) -> None:  # type: ignore[no-untyped-def]
    async with AllocationWatcher(platform.nats_url) as allocations, \
            Watcher(platform.nats_url, "gpupool.gpu.>") as watch:
        with platform.client() as api:
            finish_all(api)
            session = api.post("/v1/jobs", json={"name": "nb", "team": "research", "gpus": 1, "kind": "batch",
                                                 "gpu_models": ["L40S"]}).json()["job_id"]
            _, _, granted = await allocations.wait_for(AllocationGranted, session)
            held = granted.gpus[0]
            free = next(g for g in api.get(f"/v1/nodes/{granted.node}").json()["gpus"]
                        if g["uuid"] != held.uuid and g["allocation_id"] is None and g["state"] == "healthy")
            await fault(platform, granted.node, "rogue_process", gpu=free["index"])
            await fault(platform, granted.node, "no_process", gpu=held.index)
            (rogue,) = await watch.wait("OrphanDetected", lambda e: e.orphan == "process_without_allocation")
            assert (rogue.node, rogue.gpu_uuid) == (granted.node, free["uuid"])
            (idle,) = await watch.wait("OrphanDetected", lambda e: e.orphan == "allocation_without_process")
            assert (idle.allocation_id, idle.job_id, idle.team) == (granted.allocation_id, session, "research")
            listed = {o["kind"]: o for o in api.get("/v1/orphans").json()["items"]}
            assert listed["process_without_allocation"]["gpu_uuid"] == free["uuid"]
            assert listed["allocation_without_process"]["allocation_id"] == granted.allocation_id
            await fault(platform, granted.node, "no_process", gpu=free["index"])
            finish_all(api)
            deadline = time.monotonic() + 20
            while api.get("/v1/orphans").json()["items"]:
                assert time.monotonic() < deadline, "the orphans never resolved"
                await asyncio.sleep(0.5)
            assert len(api.get("/v1/orphans", params={"open": "false"}).json()["items"]) >= 2


async def test_one_minute_rollups_reach_their_own_stream_for_every_node(platform) -> None:  # type: ignore[no-untyped-def]
    """By now the platform has run for over a minute: every node's closed minutes are on gpupool.rollup.>."""
    nc = await nats.connect(platform.nats_url)
    try:
        js = nc.jetstream()
        deadline = time.monotonic() + 90
        while True:
            info = await js.stream_info("GPUPOOL_ROLLUPS")
            if info.state.messages >= 2:
                break
            assert time.monotonic() < deadline, "no rollups"
            await asyncio.sleep(1)
        seen = {}
        for seq in range(info.state.first_seq, info.state.last_seq + 1):
            msg = await js.get_msg("GPUPOOL_ROLLUPS", seq)
            rolled = decode_data(parse_envelope(msg.data))
            assert msg.subject == f"gpupool.rollup.local.{rolled.node}"
            assert (rolled.window_end - rolled.window_start).total_seconds() == 60
            seen[rolled.node] = rolled
        assert set(seen) == set(NODES)
        for rolled in seen.values():
            assert len(rolled.gpus) == 4 and all(g.samples >= 1 for g in rolled.gpus)
            assert all(0 <= g.utilization_avg_pct <= g.utilization_max_pct <= 100 for g in rolled.gpus)
    finally:
        await nc.close()


def test_a_scrape_of_the_simulated_agent_has_dcgm_series_for_every_gpu(platform) -> None:  # type: ignore[no-untyped-def]
    """Existing DCGM dashboards work against the agent: every GPU inventory knows has the DCGM-named series with
    the `gpu`, `UUID` and `Hostname` labels dcgm-exporter uses, in a scrape that parses."""
    from prometheus_client.parser import text_string_to_metric_families

    with platform.client() as api:
        gpus = {g["uuid"]: (n["node"], g["index"]) for n in api.get("/v1/nodes").json()["items"] for g in n["gpus"]}
    scrape = httpx.get(platform.reload()["metrics"]["agent"], timeout=10)
    assert scrape.status_code == 200
    seen: dict[str, dict[str, tuple[str, str]]] = {}
    for family in text_string_to_metric_families(scrape.text):
        for s in family.samples:
            if s.name.startswith("DCGM_FI_DEV_"):
                seen.setdefault(s.name, {})[s.labels["UUID"]] = (s.labels["Hostname"], s.labels["gpu"])
    for name in ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_POWER_USAGE",
                 "DCGM_FI_DEV_XID_ERRORS"):
        assert {u: (node, str(i)) for u, (node, i) in gpus.items()} == seen[name], name
