"""Helpers shared by the end-to-end tests (pytest puts this folder on sys.path: `from support import ...`)."""

from __future__ import annotations

import asyncio
import os
import stat
import tempfile
import time
from pathlib import Path

import nats

from libs.contracts.envelope import parse_envelope
from libs.contracts.events import decode_data

TERMINAL_WAIT_S = 20


def fake_nvidia_devices(count: int) -> Path:
    """Fake NVIDIA device nodes (char 195:N, as the driver makes them) for the agent's device allow-list; only
    root can make them (the modules that run work skip without root)."""
    root = Path(tempfile.mkdtemp(prefix="gpupool-dev-"))
    root.chmod(0o755)  # as /dev is: the work runs as an unprivileged user
    if os.geteuid() == 0:
        for i in range(count):
            os.mknod(root / f"nvidia{i}", 0o666 | stat.S_IFCHR, os.makedev(195, i))
        os.mknod(root / "nvidiactl", 0o666 | stat.S_IFCHR, os.makedev(195, 255))
    return root


def eventually(probe, what: str, timeout: float = 30.0, interval: float = 0.25):  # type: ignore[no-untyped-def]
    """Poll `probe` until it returns something truthy and return that; fail naming `what` after `timeout` s.
    One poller for every e2e module: events cross several processes, so a test waits for the outcome, bounded."""
    deadline = time.monotonic() + timeout
    while not (value := _probe_before(deadline, probe, what, timeout)):
        time.sleep(interval)
    return value


async def eventually_async(probe, what: str, timeout: float = 30.0, interval: float = 0.05):  # type: ignore[no-untyped-def]
    """`eventually` for tests that must keep their event loop running while they wait (NATS watchers)."""
    deadline = time.monotonic() + timeout
    while not (value := _probe_before(deadline, probe, what, timeout)):
        await asyncio.sleep(interval)
    return value


def _probe_before(deadline: float, probe, what: str, timeout: float):  # type: ignore[no-untyped-def]
    value = probe()
    if not value and time.monotonic() > deadline:
        raise AssertionError(f"timed out after {timeout}s waiting for {what}")
    return value


class AllocationWatcher:
    """A plain core-NATS subscriber on gpupool.allocation.>, as any other system would subscribe."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.events: list[tuple[float, object, object]] = []

    async def __aenter__(self) -> AllocationWatcher:
        self.nc = await nats.connect(self.url)

        async def on_msg(msg) -> None:  # type: ignore[no-untyped-def]
            envelope = parse_envelope(msg.data)
            self.events.append((time.monotonic(), envelope, decode_data(envelope)))

        await self.nc.subscribe("gpupool.allocation.>", cb=on_msg)
        await self.nc.flush()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.nc.close()

    def of(self, kind: type, job_id: str) -> list:
        return [(t, env, data) for t, env, data in self.events if isinstance(data, kind) and data.job_id == job_id]

    async def wait_for(self, kind: type, job_id: str, timeout: float = TERMINAL_WAIT_S) -> tuple:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = self.of(kind, job_id)
            if found:
                return found[0]
            await asyncio.sleep(0.01)
        raise AssertionError(f"no {kind.__name__} for job {job_id} within {timeout}s")

    async def wait_for_any(self, kind: type, job_ids: list[str], timeout: float = TERMINAL_WAIT_S) -> tuple:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for job_id in job_ids:
                found = self.of(kind, job_id)
                if found:
                    return found[0]
            await asyncio.sleep(0.01)
        raise AssertionError(f"no {kind.__name__} for any of {job_ids} within {timeout}s")


def submit(api, name: str, team: str, gpus: int, priority_class: str = "normal", kind: str = "training",  # type: ignore[no-untyped-def]
           **fields: object) -> str:
    """Submit a job (any other submission field as a keyword) and return its id; anything but 201 fails."""
    response = api.post("/v1/jobs", json={"name": name, "team": team, "gpus": gpus, "priority_class": priority_class,
                                          "kind": kind, **fields})
    assert response.status_code == 201, response.text
    return response.json()["job_id"]


def node_of(api, job_id: str) -> str:  # type: ignore[no-untyped-def]
    """The node a job runs on, once it runs."""
    return wait_state(api, job_id, "running")["node"]


def wait_state(api, job_id: str, state: str, timeout: float = 20) -> dict:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = api.get(f"/v1/jobs/{job_id}").json()
        if job["state"] == state:
            return job
        time.sleep(0.05)
    raise AssertionError(f"job {job_id} never became {state}: {job}")


def complete(api, job_id: str, timeout: float = 20) -> dict:  # type: ignore[no-untyped-def]
    """Complete a job once the queue knows it runs. A grant seen on NATS can reach a test before the queue has
    applied it, and completing a job the queue still has as pending is refused (409): a test that ignored that left
    the job holding its GPUs (seen under load: a probe fraction kept its share and a later job never fit)."""
    deadline = time.monotonic() + timeout
    while True:
        response = api.post(f"/v1/jobs/{job_id}/complete")
        if response.status_code == 200:
            return response.json()
        assert response.status_code == 409 and time.monotonic() < deadline, response.text
        time.sleep(0.05)


def finish_all(api) -> None:  # type: ignore[no-untyped-def]
    """Cancel every unfinished job and wait until no GPU is held. Listed again until nothing is left: a job that
    was pending when one state was listed may be running by the time the next one is."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        open_jobs = [job for state in ("running", "preempting", "launching", "pending")
                     for job in api.get("/v1/jobs", params={"state": state, "limit": 1000}).json()["items"]]
        for job in open_jobs:
            api.post(f"/v1/jobs/{job['job_id']}/cancel", json={"reason": "test cleanup"})
        held = api.get("/v1/allocations", params={"active": "true"}).json()["items"]
        if not open_jobs and not held:
            return
        time.sleep(0.2)
    raise AssertionError(f"cleanup left {len(open_jobs)} open jobs and GPUs held by "
                         f"{sorted({a['job_id'] for a in held})} after 30 s")
