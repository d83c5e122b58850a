"""Changing how a GPU is shared on a live platform: checked against what the GPU can do, never disturbing held
work (the GPU is drained of new work and switched once empty, its MIG mode turned on or off by its agent), the
transition visible in the node view, and no scheduling cycle spent on plans the store refuses."""

from __future__ import annotations

import time

import pytest
from support import AllocationWatcher, complete, eventually, finish_all, submit

from libs.contracts.events import AllocationGranted, AllocationReleased

pytestmark = pytest.mark.e2e
FLEET_NODES = 2
UP_ARGS = ["--fleet", "L40S*1;H100-80GB*2"]


def gpu(api, node: str, index: int) -> dict:  # type: ignore[no-untyped-def]
    return next(g for g in api.get(f"/v1/nodes/{node}").json()["gpus"] if g["index"] == index)


def h100_job(api, name: str, gpus: int = 1, **shape) -> str:  # type: ignore[no-untyped-def]
    return submit(api, name, "research", gpus, gpu_models=["H100-80GB"], **shape)


def held(api, node: str, index: int) -> bool:  # type: ignore[no-untyped-def]
    """Inventory has applied the grant (it learns holdings from placement's events, a moment after the grant)."""
    return eventually(lambda: gpu(api, node, index)["allocation_id"] is not None, f"{node}/{index} held", 10)


def set_mode(api, node: str, index: int, mode: str):  # type: ignore[no-untyped-def]
    return api.put(f"/v1/nodes/{node}/gpus/{index}/sharing", json={"mode": mode})


def refusals(platform) -> int:  # type: ignore[no-untyped-def]
    return platform.log("placement").count("placement_refused_by_store")


async def test_modes_change_only_as_the_gpu_allows_and_only_once_it_is_empty(platform) -> None:  # type: ignore[no-untyped-def]
    nodes = {n["gpus"][0]["model"]: n["node"] for n in platform.client().get("/v1/nodes").json()["items"]}
    l40s, h100 = nodes["L40S"], nodes["H100-80GB"]
    async with AllocationWatcher(platform.nats_url) as watcher:
        with platform.client() as api:
            finish_all(api)
            # what the GPU cannot do is refused, and nothing changes
            refused = set_mode(api, l40s, 0, "mig")
            assert refused.status_code == 422 and refused.json()["reason"] == "SharingModeUnsupported", refused.text
            assert refused.headers["content-type"].startswith("application/problem+json")
            assert gpu(api, l40s, 0)["sharing"] == "exclusive"

            # exclusive -> mig on an H100 that holds work (MIG mode off): drained, not switched
            holder = h100_job(api, "holder", 2)
            await watcher.wait_for(AllocationGranted, holder)
            held(api, h100, 0)
            draining = set_mode(api, h100, 0, "mig").json()
            assert (draining["mode"], draining["draining_to"], draining["changed"]) == ("exclusive", "mig", False)
            view = gpu(api, h100, 0)
            assert (view["sharing"], view["draining_to"], view["mig_mode"]) == ("exclusive", "mig", False)
            slice_job = h100_job(api, "slice", mig_profile="1g.10gb")
            time.sleep(2.0)
            assert api.get(f"/v1/jobs/{slice_job}").json()["state"] == "pending"  # no MIG GPU yet

            # the holder ends: the GPU switches, its agent turns MIG mode on, the slice lands on it
            complete(api, holder)
            await watcher.wait_for(AllocationReleased, holder)
            _, _, granted = await watcher.wait_for(AllocationGranted, slice_job)
            assert (granted.node, granted.gpus[0].index, granted.gpus[0].mig_profile) == (h100, 0, "1g.10gb")
            assert eventually(lambda: gpu(api, h100, 0)["mig_mode"] and gpu(api, h100, 0)["sharing"] == "mig"
                              and gpu(api, h100, 0)["draining_to"] is None, "GPU 0 in MIG mode", timeout=15)

            # mig -> exclusive while the slice runs: drained; a whole-GPU job goes elsewhere or waits, and no
            # cycle plans onto the busy GPU (the store never refuses a plan)
            before = refusals(platform)
            held(api, h100, 0)
            draining = set_mode(api, h100, 0, "exclusive").json()
            assert (draining["mode"], draining["draining_to"]) == ("mig", "exclusive")
            pair = h100_job(api, "pair", 2)  # needs both H100s: waits for GPU 0
            time.sleep(3.0)
            assert api.get(f"/v1/jobs/{pair}").json()["state"] == "pending"
            assert refusals(platform) == before, "placement planned onto a draining GPU"

            complete(api, slice_job)
            _, _, granted = await watcher.wait_for(AllocationGranted, pair)
            assert sorted(g.index for g in granted.gpus) == [0, 1] and all(g.mig_profile is None
                                                                           for g in granted.gpus)
            assert eventually(lambda: gpu(api, h100, 0)["mig_mode"] is False
                              and gpu(api, h100, 0)["sharing"] == "exclusive", "GPU 0 out of MIG mode", timeout=15)

            # an empty GPU switches at once, and asking for the current mode calls a waiting change off
            complete(api, pair)
            await watcher.wait_for(AllocationReleased, pair)
            eventually(lambda: gpu(api, h100, 1)["allocation_id"] is None, "inventory saw the release", 10)
            now = set_mode(api, h100, 1, "fractional").json()
            assert (now["mode"], now["draining_to"], now["changed"]) == ("fractional", None, True)
            fraction = h100_job(api, "fraction", gpu_fraction_milli=500, gpu_memory_mib=4096)
            _, _, granted = await watcher.wait_for(AllocationGranted, fraction)
            assert (granted.gpus[0].index, granted.gpus[0].share_milli) == (1, 500)
            held(api, h100, 1)
            assert set_mode(api, h100, 1, "exclusive").json()["draining_to"] == "exclusive"
            kept = set_mode(api, h100, 1, "fractional").json()
            assert (kept["mode"], kept["draining_to"], kept["changed"]) == ("fractional", None, False)
            assert gpu(api, h100, 1)["draining_to"] is None
            finish_all(api)
