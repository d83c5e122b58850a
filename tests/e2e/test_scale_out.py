"""Scale-out with real processes: `gpupool up --nats-cluster 3 --replicas 2` runs a 3-node JetStream cluster with
streams replicated three ways and two replicas of every backend service sharing durable consumers. Under a steady
stream of submissions and completions, one NATS node and one replica of every service are killed: no accepted job
is lost, every job is placed exactly once, no GPU is ever held twice, and no event is missing from the stream."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections import defaultdict
from datetime import datetime
from pathlib import Path

import httpx
import nats
import pytest
from nats.js.api import DeliverPolicy

from libs.contracts.envelope import parse_envelope
from libs.contracts.events import AllocationGranted, AllocationReleased, JobStateChanged, decode_data

pytestmark = pytest.mark.e2e
JOBS = 40
FAULT_AFTER = 15
BACKEND = ("inventory", "quota", "queue", "placement", "reclamation", "accounting")


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"  # a killed child not yet reaped is a zombie
    except FileNotFoundError:
        return False


async def submit(api: httpx.AsyncClient, i: int) -> str:
    """What a careful client does: retry with the same Idempotency-Key until the gateway answers, so a failover
    never creates a second job nor loses the first."""
    key = f"scale-{i}-{uuid.uuid4()}"
    deadline = time.monotonic() + 60
    while True:
        try:
            r = await api.post("/v1/jobs", json={"name": f"job-{i}", "team": "research", "gpus": 1},
                               headers={"Idempotency-Key": key})
            if r.status_code in (200, 201):
                return r.json()["job_id"]
            assert r.status_code >= 500, r.text  # only the platform's own unavailability is retried
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline, f"job {i} was never accepted"
        await asyncio.sleep(0.5)


async def complete_running(api: httpx.AsyncClient, stop: asyncio.Event) -> None:
    """The workloads: every running job finishes soon after it starts, so capacity turns over."""
    while not stop.is_set():
        try:
            running = (await api.get("/v1/jobs", params={"state": "running", "limit": 1000})).json()["items"]
            for job in running:
                await api.post(f"/v1/jobs/{job['job_id']}/complete")
        except (httpx.HTTPError, KeyError, ValueError):
            pass
        await asyncio.sleep(0.3)


async def stream_events(url: str) -> list[tuple[str, object]]:
    """Everything the events stream holds, read back from JetStream (not from a live subscription that could miss
    messages during a failover): (event id, payload)."""
    nc = await nats.connect(servers=url.split(","))
    try:
        js = nc.jetstream()
        info = await js.stream_info("GPUPOOL_EVENTS")
        sub = await js.subscribe("gpupool.>", stream="GPUPOOL_EVENTS", ordered_consumer=True,
                                 deliver_policy=DeliverPolicy.ALL)
        out = []
        for _ in range(info.state.messages):
            msg = await sub.next_msg(timeout=10)
            envelope = parse_envelope(msg.data)
            out.append((envelope.id, decode_data(envelope)))
        await sub.unsubscribe()
        return out
    finally:
        await nc.close()


async def test_losing_a_nats_node_and_a_replica_of_every_service_loses_nothing(tmp_path) -> None:  # type: ignore[no-untyped-def]
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPOOL_")}
    with open(tmp_path / "up.out", "wb") as out:
        up = subprocess.Popen(
            [sys.executable, "-m", "libs.cli.main", "up", "--port", "0", "--data-dir", str(tmp_path),
             "--nats-cluster", "3", "--replicas", "2", "--fleet", "H100-80GB*8;H100-80GB*8",
             "--telemetry-interval", "1", "--env", "placement:MIN_RUNTIME_S=0"],
            env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 180
        while not (tmp_path / "run.json").exists():
            assert up.poll() is None and time.monotonic() < deadline, (tmp_path / "up.out").read_text()[-3000:]
            await asyncio.sleep(0.3)
        run = json.loads((tmp_path / "run.json").read_text())
        assert set(run["servers"]) == {"nats-0", "nats-1", "nats-2", "postgres"}
        for name in ("nats-0", "nats-1", "nats-2"):  # no monitoring port: it would list users to anyone who asks
            cmdline = Path(f"/proc/{run['servers'][name]['pid']}/cmdline").read_bytes().split(b"\0")
            assert b"-m" not in cmdline and b"--http_port" not in cmdline, cmdline
        assert {f"{s}-2" for s in BACKEND} <= set(run["services"])
        headers = {"Authorization": f"Bearer {run['admin_token']}"}
        async with httpx.AsyncClient(base_url=run["gateway_url"], headers=headers, timeout=10) as api:
            while len((await api.get("/v1/nodes")).json().get("items", [])) < 2:
                assert time.monotonic() < deadline, "the fleet never registered"
                await asyncio.sleep(0.3)
            stop = asyncio.Event()
            completer = asyncio.create_task(complete_running(api, stop))
            accepted: list[str] = []
            killed: dict[str, int] = {}  # service → its second replica's restart count when it was killed
            for i in range(JOBS):
                accepted.append(await submit(api, i))
                if i + 1 == FAULT_AFTER:
                    os.kill(run["servers"]["nats-1"]["pid"], signal.SIGKILL)
                    now = json.loads((tmp_path / "run.json").read_text())  # pids as they are now
                    for service in BACKEND:
                        os.kill(now["services"][f"{service}-2"]["pid"], signal.SIGKILL)
                        killed[service] = now["services"][f"{service}-2"]["restarts"]
                await asyncio.sleep(0.25)
            assert len(set(accepted)) == JOBS
            # every accepted job runs and completes
            while True:
                states = {j["job_id"]: j["state"] for j in
                          (await api.get("/v1/jobs", params={"limit": 1000})).json()["items"]}
                if all(states.get(j) == "completed" for j in accepted):
                    break
                if os.environ.get("GPUPOOL_TEST_VERBOSE"):
                    print({j: states.get(j) for j in accepted if states.get(j) != "completed"}, flush=True)
                assert time.monotonic() < deadline + 120, \
                    {j: states.get(j) for j in accepted if states.get(j) != "completed"}
                await asyncio.sleep(0.5)
            stop.set()
            await completer
            # the faults really happened: the killed replicas were restarted by the supervisor, the node stays down
            # (the supervisor restarts with a back-off: with every job done quickly, a restart may still be due)
            while True:
                after = json.loads((tmp_path / "run.json").read_text())
                if all(after["services"][f"{s}-2"]["restarts"] > killed[s] for s in BACKEND):
                    break
                assert time.monotonic() < deadline + 180, after["services"]
                await asyncio.sleep(0.5)
            assert not alive(run["servers"]["nats-1"]["pid"])
            # the queue completes a job before placement has applied job.completed (a replica may still be catching
            # up after the faults): wait until placement has released every allocation too
            while True:
                allocations = (await api.get("/v1/allocations", params={"limit": 1000})).json()["items"]
                if all(a["released_at"] is not None for a in allocations):
                    break
                assert time.monotonic() < deadline + 240, [a for a in allocations if a["released_at"] is None]
                await asyncio.sleep(0.5)

        # exactly one allocation per job, never two live holders of one GPU
        by_job = defaultdict(list)
        for a in allocations:
            by_job[a["job_id"]].append(a)
        assert {j: len(by_job[j]) for j in accepted} == {j: 1 for j in accepted}
        intervals = defaultdict(list)
        for a in allocations:
            assert a["released_at"] is not None
            for g in a["gpus"]:
                intervals[g["uuid"]].append((datetime.fromisoformat(a["granted_at"]),
                                             datetime.fromisoformat(a["released_at"])))
        for uuid_, spans in intervals.items():
            spans.sort()
            for (_, end), (start, _) in zip(spans, spans[1:], strict=False):
                assert start >= end, f"GPU {uuid_} held twice"

        # the stream (replicated on the two surviving nodes) has every event of every job exactly once
        events = await stream_events(run["nats_url"])
        ids = [eid for eid, _ in events]
        assert len(ids) == len(set(ids)), "an event was stored twice"
        granted = defaultdict(set)
        released = defaultdict(set)
        moves = defaultdict(list)
        for _, data in events:
            if isinstance(data, AllocationGranted):
                granted[data.job_id].add(data.allocation_id)
            elif isinstance(data, AllocationReleased):
                released[data.job_id].add(data.allocation_id)
            elif isinstance(data, JobStateChanged):
                moves[data.job_id].append(data.current)
        for job_id in accepted:
            assert len(granted[job_id]) == 1 and granted[job_id] == released[job_id], job_id
            assert moves[job_id] == ["pending", "running", "completed"], (job_id, moves[job_id])
    finally:
        up.send_signal(signal.SIGTERM)
        try:
            up.wait(timeout=90)
        except subprocess.TimeoutExpired:
            up.kill()
