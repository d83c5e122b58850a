"""Two placement replicas: one leads through the NATS KV lease. SIGKILL of the leader under a steady stream of
submissions: a new leader within 5 seconds, every job placed exactly once, no GPU held twice."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import time

import httpx
import pytest
from support import AllocationWatcher

from libs.contracts.events import AllocationGranted

pytestmark = pytest.mark.e2e
UP_ARGS = ["--placement-replicas", "2"]
REPLICAS = ("placement", "placement-2")
JOBS = 24


def is_leader(platform, replica: str) -> bool:  # type: ignore[no-untyped-def]
    url = platform.reload()["services"][replica]["url"]
    try:
        text = httpx.get(f"{url}/metrics", timeout=2).text
    except httpx.HTTPError:
        return False
    match = re.search(rf'gpupool_leader\{{replica="{replica}",service="placement"\}} (\S+)', text)
    return bool(match) and float(match.group(1)) == 1.0


async def wait_for_leader(platform, candidates: tuple[str, ...], timeout: float,  # type: ignore[no-untyped-def]
                          not_pid: int | None = None) -> str:
    """A replica that leads; with `not_pid`, a process other than that one (the supervisor restarts a killed
    replica under the same name, and the restarted process may win the election: that is a new leader too)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for replica in candidates:
            if is_leader(platform, replica) and platform.pid(replica) != not_pid:
                return replica
        await asyncio.sleep(0.1)
    raise AssertionError(f"no leader among {candidates} within {timeout}s")


async def test_killing_the_leader_under_load_hands_over_within_5s_and_places_every_job_once(platform) -> None:  # type: ignore[no-untyped-def]
    leader = await wait_for_leader(platform, REPLICAS, timeout=15)
    follower = next(r for r in REPLICAS if r != leader)
    assert not is_leader(platform, follower), "exactly one leader"

    async with AllocationWatcher(platform.nats_url) as watcher:
        with platform.client() as api:
            job_ids: list[str] = []
            killed_at = None
            for i in range(JOBS):
                response = api.post("/v1/jobs", json={"name": f"failover-{i}", "team": "research", "gpus": 1})
                assert response.status_code == 201, response.text
                job_ids.append(response.json()["job_id"])
                if i == JOBS // 3:
                    killed_pid = platform.pid(leader)
                    os.kill(killed_pid, signal.SIGKILL)
                    killed_at = time.monotonic()
                await asyncio.sleep(0.15)
            assert killed_at is not None
            new_leader = await wait_for_leader(platform, REPLICAS, timeout=10, not_pid=killed_pid)
            handover_s = time.monotonic() - killed_at
            for job_id in job_ids:
                await watcher.wait_for(AllocationGranted, job_id, timeout=30)
            await asyncio.sleep(2.0)

            active = api.get("/v1/allocations", params={"active": "true", "limit": 1000}).json()["items"]
    print(f"leader {leader} killed; {new_leader} led after ≤{handover_s:.2f}s (checked after the submissions)")
    for job_id in job_ids:
        assert len(watcher.of(AllocationGranted, job_id)) == 1, f"job {job_id} granted more than once"
        assert sum(1 for a in active if a["job_id"] == job_id) == 1
    held = [g["uuid"] for a in active for g in a["gpus"]]
    assert len(held) == len(set(held)), "a GPU is held by two live allocations"


async def test_new_leader_is_elected_within_5_seconds_of_a_sigkill(platform) -> None:  # type: ignore[no-untyped-def]
    leader = await wait_for_leader(platform, REPLICAS, timeout=15)
    killed = platform.pid(leader)
    os.kill(killed, signal.SIGKILL)
    started = time.monotonic()
    new_leader = await wait_for_leader(platform, REPLICAS, timeout=5, not_pid=killed)
    print(f"{leader} killed; {new_leader} (pid {platform.pid(new_leader)}) led after "
          f"{time.monotonic() - started:.2f}s")
