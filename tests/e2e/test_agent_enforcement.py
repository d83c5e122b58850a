"""The agent applies what placement decided, on a real `gpupool up`: a MIG slice's instance is created on the
simulated node when the job is granted and destroyed when it completes; a fraction whose process grows past its
memory limit is reported and, with policy stop, the process is stopped."""

from __future__ import annotations

import asyncio
import json
import time

import nats
import pytest
from support import complete

from libs.contracts import subjects
from libs.contracts.envelope import parse_envelope
from libs.contracts.events import AllocationGranted, FractionExceeded, MigApplied, decode_data

FLEET_NODES = 2
# sim-node-0: one L40S (made fractional below); sim-node-1: two A100s that start in MIG mode
UP_ARGS = ["--fleet", "L40S*1;A100-80GB*2", "--env", "agent:SIM_MIG=A100-80GB",
           "--env", "agent:FRACTION_POLICY=stop", "--env", "agent:FRACTION_STOP_GRACE_S=1"]
pytestmark = pytest.mark.e2e


class Watch:
    """Allocation and agent events, as any subscriber sees them."""

    def __init__(self) -> None:
        self.events: list[object] = []

    async def start(self, url: str) -> None:
        self.nc = await nats.connect(url)

        async def on_msg(msg) -> None:  # type: ignore[no-untyped-def]
            self.events.append(decode_data(parse_envelope(msg.data)))

        for subject in (subjects.ALLOCATION_ALL, subjects.AGENT_ALL):
            await self.nc.subscribe(subject, cb=on_msg)
        await self.nc.flush()

    async def wait(self, kind: type, timeout: float = 20, **fields: object) -> object:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for e in self.events:
                if isinstance(e, kind) and all(getattr(e, k) == v for k, v in fields.items()):
                    return e
            await asyncio.sleep(0.05)
        raise AssertionError(f"no {kind.__name__} with {fields} in {timeout}s: {self.events[-10:]}")


def post(api, **body) -> str:  # type: ignore[no-untyped-def]
    response = api.post("/v1/jobs", json={"team": "research", "gpus": 1, **body})
    assert response.status_code == 201, response.text
    return response.json()["job_id"]


def l40s_processes(api) -> int | None:  # type: ignore[no-untyped-def]
    [gpu] = api.get("/v1/nodes/sim-node-0").json()["gpus"]
    return (gpu["telemetry"] or {}).get("process_count")


async def test_mig_instances_follow_their_allocations_and_an_overgrown_fraction_is_stopped(platform) -> None:
    watch = Watch()
    await watch.start(platform.nats_url)
    try:
        with platform.client() as api:
            a100s = api.get("/v1/nodes/sim-node-1").json()["gpus"]
            assert [g["mig_mode"] for g in a100s] == [True, True], a100s  # placement plans MIG on them
            assert [g["sharing"] for g in a100s] == ["mig", "mig"], a100s  # and the pool view says so
            response = api.put("/v1/nodes/sim-node-0/gpus/0/sharing", json={"mode": "fractional"})
            assert response.status_code == 200, response.text

            # MIG: the grant's slice becomes an instance on the node, at the planned slot
            mig_job = post(api, name="slice", kind="inference", mig_profile="3g.40gb", gpu_models=["A100-80GB"])
            granted = await watch.wait(AllocationGranted, job_id=mig_job)
            [held] = granted.gpus
            created = await watch.wait(MigApplied, job_id=mig_job, action="created")
            assert (created.allocation_id, created.gpu_uuid, created.profile, created.start) == \
                (granted.allocation_id, held.uuid, "3g.40gb", held.mig_start)
            assert created.mig_uuid and created.mig_uuid.startswith("MIG-") and created.node == "sim-node-1"
            complete(api, mig_job)
            destroyed = await watch.wait(MigApplied, job_id=mig_job, action="destroyed")
            assert (destroyed.allocation_id, destroyed.start) == (granted.allocation_id, held.mig_start)

            # a fraction: its process stays inside 8 GiB until it hogs memory, then it is reported and stopped
            frac_job = post(api, name="frac", kind="training", gpu_fraction_milli=300, gpu_memory_mib=8192,
                            gpu_models=["L40S"])
            frac = await watch.wait(AllocationGranted, job_id=frac_job, timeout=30)
            assert frac.environment["GPUPOOL_ALLOCATION_ID"] == frac.allocation_id
            deadline = time.monotonic() + 20
            while l40s_processes(api) != 1:
                assert time.monotonic() < deadline, "the fraction's process never showed in telemetry"
                await asyncio.sleep(0.2)
            await asyncio.sleep(2)  # inside its limit for a while: nothing reported
            assert not [e for e in watch.events if isinstance(e, FractionExceeded)]
            await watch.nc.publish(subjects.SIM_FAULT, json.dumps(
                {"node": "sim-node-0", "gpu": 0, "fault": "memory_hog", "factor": 2}).encode())
            exceeded = await watch.wait(FractionExceeded, job_id=frac_job)
            assert (exceeded.allocation_id, exceeded.limit_mib, exceeded.action) == \
                (frac.allocation_id, 8192, "stopped")
            assert exceeded.used_mib > 8192 and exceeded.node == "sim-node-0"
            deadline = time.monotonic() + 15
            while l40s_processes(api) != 0:
                assert time.monotonic() < deadline, "the stopped process still shows in telemetry"
                await asyncio.sleep(0.2)
            assert len([e for e in watch.events if isinstance(e, FractionExceeded)]) == 1
            api.post(f"/v1/jobs/{frac_job}/complete")
    finally:
        await watch.nc.close()
