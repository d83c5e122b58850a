"""Fair share on a live platform: what a team used (decayed over the half-life) orders its waiting jobs behind an
idle team's, and `explain` reports the position the scheduler really uses."""

from __future__ import annotations

import time

import pytest
from support import AllocationWatcher, complete, eventually, finish_all, submit

from libs.contracts.events import AllocationGranted, AllocationReleased

pytestmark = pytest.mark.e2e
FLEET_NODES = 1
UP_ARGS = ["--fleet", "H100-80GB*8"]


def _position(api, job_id: str) -> tuple[int, str] | None:  # type: ignore[no-untyped-def]
    p = api.get(f"/v1/jobs/{job_id}/explain").json()["placement"]
    return (p["position"], p["position_basis"]) if p.get("state") == "pending" and p.get("position") else None


async def test_a_team_that_just_used_gpus_waits_behind_an_idle_team(platform) -> None:  # type: ignore[no-untyped-def]
    async with AllocationWatcher(platform.nats_url) as watcher:
        with platform.client() as api:
            finish_all(api)
            # research uses the whole node for a few seconds (~8 GPUs x 3 s of history), then lets go
            used = submit(api, "used", "research", 8)
            await watcher.wait_for(AllocationGranted, used)
            time.sleep(3.0)
            complete(api, used)
            await watcher.wait_for(AllocationReleased, used)

            # a third team holds the node while research (first) and inference (second) queue for all of it
            blocker = submit(api, "blocker", "platform", 8)
            await watcher.wait_for(AllocationGranted, blocker)
            busy = submit(api, "busy-team", "research", 8)
            time.sleep(0.05)  # strictly later submit time
            idle = submit(api, "idle-team", "inference", 8)

            # submit order alone (the old position) says research first; fair share puts the idle team first,
            # and explain says so once a cycle has ordered them
            try:
                eventually(lambda: _position(api, idle) == (1, "last_cycle")
                           and _position(api, busy) == (2, "last_cycle"),
                           "explain's positions from the scheduler's order", timeout=15)
            except AssertionError as exc:
                raise AssertionError(f"{exc}: {api.get(f'/v1/jobs/{idle}/explain').json()} "
                                     f"{api.get(f'/v1/jobs/{busy}/explain').json()}") from None

            complete(api, blocker)
            _, _, first = await watcher.wait_for_any(AllocationGranted, [busy, idle])
            assert first.job_id == idle, "the team that just used the node went first"
            assert api.get(f"/v1/jobs/{busy}").json()["state"] == "pending"
            finish_all(api)
