"""Sharing end to end on a real `gpupool up`: fractions share a fractional GPU within its compute and memory, MIG
slices land on disjoint slots of a GPU in MIG mode, a dev job takes a share by default, whole-GPU jobs keep to
whole GPUs, and every allocation event says what share of each GPU it holds."""

from __future__ import annotations

import asyncio
import time

import nats
import pytest
from support import AllocationWatcher, complete, finish_all, wait_state

from libs.contracts import subjects
from libs.contracts.envelope import utcnow
from libs.contracts.events import AllocationGranted, GpuSharingSet
from libs.core import mig as migcat

FLEET_NODES = 2
UP_ARGS = ["--fleet", "L40S*2;A100-80GB*2", "--env", "placement:DEV_FRACTION_MILLI=200",
           "--env", "placement:DEV_GPU_MEMORY_MIB=8192"]
pytestmark = pytest.mark.e2e


def gpus_by_model(api) -> dict[str, list[dict]]:  # type: ignore[no-untyped-def]
    out: dict[str, list[dict]] = {}
    for node in api.get("/v1/nodes").json()["items"]:
        for g in node["gpus"]:
            out.setdefault(g["model"], []).append({**g, "node": node["node"], "cluster": node["cluster"]})
    return {m: sorted(gs, key=lambda g: g["index"]) for m, gs in out.items()}


async def set_sharing(url: str, gpu: dict, mode: str) -> None:
    """What inventory emits when an operator sets a GPU's sharing mode (published here as inventory would)."""
    nc = await nats.connect(url)
    try:
        event = GpuSharingSet(cluster=gpu["cluster"], node=gpu["node"], gpu_uuid=gpu["uuid"], gpu_index=gpu["index"],
                              mode=mode, set_by="e2e", set_at=utcnow()).to_cloudevent("/gpupool/inventory")
        await nc.jetstream().publish(subjects.GPU_SHARING_SET, event.model_dump_json().encode(),
                                     headers={"Nats-Msg-Id": event.id})
    finally:
        await nc.close()


async def fractional_l40s_mig_a100s(url: str, gpus: dict[str, list[dict]]) -> None:
    """The first L40S fractional, every A100 in MIG mode (the modes these tests share GPUs by)."""
    await set_sharing(url, gpus["L40S"][0], "fractional")
    for g in gpus["A100-80GB"]:
        await set_sharing(url, g, "mig")


async def modes_learned(api, watch: AllocationWatcher) -> None:  # type: ignore[no-untyped-def]
    """A probe fraction: once it lands, placement has learned the modes."""
    probe = post(api, name="probe", gpu_fraction_milli=100, gpu_memory_mib=1024, gpu_models=["L40S"])
    await watch.wait_for(AllocationGranted, probe, timeout=30)
    complete(api, probe)


def post(api, **body) -> str:  # type: ignore[no-untyped-def]
    response = api.post("/v1/jobs", json={"team": "research", "kind": "training", "gpus": 1, **body})
    assert response.status_code == 201, response.text
    return response.json()["job_id"]


def explain_reason(api, job_id: str, want: str, timeout: float = 15) -> dict:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        doc = api.get(f"/v1/jobs/{job_id}/explain").json()
        if doc.get("placement", {}).get("reason") == want:
            return doc
        time.sleep(0.1)
    raise AssertionError(f"{job_id} never explained as {want}: {doc}")


async def test_fractions_mig_slices_and_dev_defaults_share_gpus_without_overfilling_them(platform) -> None:
    with platform.client() as api:
        gpus = gpus_by_model(api)
        frac_gpu, whole_l40s = gpus["L40S"]
        await fractional_l40s_mig_a100s(platform.nats_url, gpus)
        async with AllocationWatcher(platform.nats_url) as watch:
            await modes_learned(api, watch)

            a = post(api, name="frac-a", gpu_fraction_milli=500, gpu_memory_mib=20_000)
            b = post(api, name="frac-b", gpu_fraction_milli=300, gpu_memory_mib=16_000)
            dev = post(api, name="notebook", kind="dev")  # no share named: the default 200 milli / 8 GiB
            granted = {j: (await watch.wait_for(AllocationGranted, j))[2] for j in (a, b, dev)}
            for job_id, (milli, mem) in {a: (500, 20_000), b: (300, 16_000), dev: (200, 8192)}.items():
                [held] = granted[job_id].gpus
                assert (held.uuid, held.share_milli, held.memory_mib, held.mig_profile) == \
                    (frac_gpu["uuid"], milli, mem, None)
                # the limits CUDA MPS enforces travel with the grant
                assert granted[job_id].environment == {
                    "CUDA_VISIBLE_DEVICES": frac_gpu["uuid"], "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": str(milli // 10),
                    "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": f"0={mem}M",
                    "GPUPOOL_ALLOCATION_ID": granted[job_id].allocation_id}
            # 1000 milli are held: one more fraction cannot fit on the only fractional GPU and waits
            c = post(api, name="frac-c", gpu_fraction_milli=100, gpu_memory_mib=1024)
            assert explain_reason(api, c, "NoFeasibleNode")["state"] == "pending"
            # a whole-GPU job takes the exclusive L40S, never a share of the fractional one
            whole = post(api, name="whole", gpu_models=["L40S"])
            [held] = (await watch.wait_for(AllocationGranted, whole))[2].gpus
            assert (held.uuid, held.share_milli) == (whole_l40s["uuid"], 1000)

            # MIG: two 3g.40gb and two 1g.10gb slices on two A100s in MIG mode
            slices = [post(api, name=f"mig-{i}", kind="inference", mig_profile=p, gpu_models=["A100-80GB"])
                      for i, p in enumerate(["3g.40gb", "3g.40gb", "1g.10gb", "1g.10gb"])]
            held_slices = [(await watch.wait_for(AllocationGranted, j))[2].gpus[0] for j in slices]
            by_gpu: dict[str, list[tuple[str, int]]] = {}
            for h in held_slices:
                assert h.mig_profile is not None and h.mig_start is not None
                assert h.share_milli == migcat.profile("A100-80GB", h.mig_profile).milli
                by_gpu.setdefault(h.uuid, []).append((h.mig_profile, h.mig_start))
            assert all(migcat.valid_layout("A100-80GB", layout) for layout in by_gpu.values()), by_gpu
            # the job view shows what the job asked for
            assert api.get(f"/v1/jobs/{slices[0]}").json()["mig_profile"] == "3g.40gb"

            # completing a fraction frees its share: the waiting one gets in
            complete(api, a)
            [held] = (await watch.wait_for(AllocationGranted, c))[2].gpus
            assert (held.uuid, held.share_milli) == (frac_gpu["uuid"], 100)
            wait_state(api, c, "running")
        finish_all(api)


async def test_a_dev_session_falls_back_to_a_mig_slice_while_every_fractional_gpu_is_full(platform) -> None:  # type: ignore[no-untyped-def]
    with platform.client() as api:
        finish_all(api)
        gpus = gpus_by_model(api)
        await fractional_l40s_mig_a100s(platform.nats_url, gpus)
        async with AllocationWatcher(platform.nats_url) as watch:
            await modes_learned(api, watch)
            # the only fractional GPU is as good as full: the dev default (200 milli) no longer fits on it
            full = post(api, name="full", gpu_fraction_milli=900, gpu_memory_mib=40_000, gpu_models=["L40S"])
            await watch.wait_for(AllocationGranted, full)
            notebook = post(api, name="notebook", kind="dev")  # no share named
            [held] = (await watch.wait_for(AllocationGranted, notebook))[2].gpus
            # the next share in the documented order: the smallest MIG slice with the dev memory (8 GiB)
            assert held.mig_profile == "1g.10gb" and held.uuid in {g["uuid"] for g in gpus["A100-80GB"]}, held
            wait_state(api, notebook, "running")
        finish_all(api)


async def test_a_share_that_contradicts_itself_or_names_an_unknown_mig_profile_is_refused(platform) -> None:
    with platform.client() as api:
        for body, words in [
            ({"gpu_fraction_milli": 300}, "gpu_memory_mib"),
            ({"gpu_fraction_milli": 300, "gpu_memory_mib": 1, "mig_profile": "1g.10gb"}, "not both"),
            ({"gpus": 2, "mig_profile": "1g.10gb"}, "gpus must be 1"),
            ({"mig_profile": "1g.5gb", "gpu_models": ["A100-80GB"]}, "known: 1g.10gb"),
            ({"kind": "dev", "exclusive": True, "gpu_fraction_milli": 100, "gpu_memory_mib": 1}, "exclusive"),
        ]:
            response = api.post("/v1/jobs", json={"name": "bad", "team": "research", "gpus": 1, **body})
            assert response.status_code == 422, (body, response.text)
            assert response.headers["content-type"].startswith("application/problem+json")
            assert words in response.text, (words, response.text)
    await asyncio.sleep(0)


def test_every_deciding_cycle_is_recorded_and_replays_to_the_same_plan(platform) -> None:
    """Runs after the sharing test in this module: its cycles placed fractions and MIG slices and preempted nothing.
    Each recorded cycle, fetched over the API and scheduled again by this process's core, gives the same plan."""
    from libs.cli.decisions import replay
    from libs.client import GpupoolClient

    with GpupoolClient(platform.gateway, platform.run["admin_token"]) as gp:
        decisions = gp.list_decisions(limit=200)
        assert decisions, "no scheduling cycle was recorded"
        placed = [d for d in decisions if any(p["applied"] for p in d.placements)]
        mig_cycles = [d for d in placed if any(p["mig_profile"] for p in d.placements)]
        assert placed and mig_cycles
        assert [d.cycle_id for d in decisions] == sorted((d.cycle_id for d in decisions), reverse=True)
        for d in placed[:5] + mig_cycles[:1]:
            assert d.versions["gpus"] == 4 and d.versions["nodes"] == 2
            result = replay(gp.get_decision(d.cycle_id))
            assert result["same"], result
            assert result["placements"] == len(d.placements)
    with platform.client() as api:
        member = api.post("/v1/tokens", json={"name": "decisions-member", "role": "member",
                                               "team": "research"}).json()["token"]
        denied = api.get("/v1/decisions", headers={"Authorization": f"Bearer {member}"})
        assert denied.status_code == 403 and denied.headers["content-type"].startswith("application/problem+json")
        missing = api.get("/v1/decisions/not-a-cycle")
        assert missing.status_code == 404 and missing.json()["reason"] == "DecisionNotFound"


def test_services_expose_scheduling_queue_and_bus_metrics(platform) -> None:
    """After the cycles above: placement reports cycle and phase times, decisions and holdings; the queue its
    depth, waits and transitions; every consumer its lag (read every GPUPOOL_*_METRICS_INTERVAL_S)."""
    import httpx

    def scrape(service: str) -> str:
        return httpx.get(platform.reload()["services"][service]["url"] + "/metrics", timeout=5).text

    with platform.client() as api:
        held = post(api, name="metrics-probe", kind="inference", mig_profile="3g.40gb", gpu_models=["A100-80GB"])
        wait_state(api, held, "running")
    deadline = time.monotonic() + 30
    while True:
        placement, queue = scrape("placement"), scrape("queue")
        wanted = {
            "placement": ["gpupool_scheduling_cycle_seconds_count", 'gpupool_scheduling_phase_seconds_count{phase="place"}',
                          'gpupool_scheduling_decisions_total{outcome="placed"}', 'gpupool_allocations{state="running"}',
                          'gpupool_gpus_allocated{gpu_model="A100-80GB"}', 'gpupool_bus_consumer_pending{consumer="placement"}'],
            "queue": ['gpupool_queue_jobs{', 'gpupool_queue_wait_seconds_count{', 'gpupool_job_transitions_total{',
                      'gpupool_bus_consumer_pending{consumer="queue"}'],
        }
        missing = [m for m in wanted["placement"] if m not in placement] + [m for m in wanted["queue"] if m not in queue]
        if not missing:
            break
        assert time.monotonic() < deadline, f"metrics never appeared: {missing}"
        time.sleep(1)
    # the slice counts by its share of the GPU (3 of 7 compute slices), the job in the queue's depth
    line = next(x for x in placement.splitlines() if x.startswith('gpupool_gpus_allocated{gpu_model="A100-80GB"}'))
    assert float(line.split()[-1]) == 0.428
    assert 'gpupool_queue_jobs{priority_class="normal",state="running",team="research"} 1.0' in queue
    with platform.client() as api:
        finish_all(api)
