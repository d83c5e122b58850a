"""The tiers on the node (issue #17): a training gang whose members find each other the way torchrun expects, and
runs, fails and restarts as one; an inference service whose replicas serve at endpoints behind a health check. Real processes in real cgroups on a simulated fleet of two nodes, each node at its
own loopback address, so the gang's rendezvous is real TCP between "nodes". Needs root (cgroups, device nodes)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import nats
import pytest
from support import (
    AllocationWatcher,
    eventually,
    eventually_async,
    fake_nvidia_devices,
    finish_all,
    wait_state,
)

from libs.check import CheckConfig, check_async
from libs.contracts.envelope import parse_envelope
from libs.contracts.events import (
    AllocationGangReady,
    AllocationGranted,
    AllocationReleased,
    EndpointUnready,
    decode_data,
)

pytestmark = [pytest.mark.e2e,
              pytest.mark.skipif(os.geteuid() != 0, reason="the executor needs root for cgroups and device nodes")]

DEVICES = fake_nvidia_devices(4)
CHECKPOINTS = Path(tempfile.mkdtemp(prefix="gpupool-ckpt-"))  # one filesystem for both nodes: resume anywhere
CHECKPOINTS.chmod(0o755)
FLEET_NODES = 2
UP_ARGS = ["--fleet", "H100-80GB*4;H100-80GB*4",
           "--env", f"agent:DEVICE_DIR={DEVICES}", "--env", f"agent:CHECKPOINT_ROOT={CHECKPOINTS}",
           "--env", "placement:PREEMPTION_GRACE_S=3", "--env", "placement:MIN_RUNTIME_S=0",
           # a node silent for 10 s is lost (one member's loss stops its gang), requeued after 1 s
           "--env", "inventory:NODE_LOST_AFTER_S=10", "--env", "inventory:NODE_SWEEP_INTERVAL_S=0.5",
           "--env", "agent:HEARTBEAT_S=2",  # well under the loss time, and fresh utilisation for autoscaling
           "--env", "reclamation:SWEEP_INTERVAL_S=0.5", "--env", "queue:REQUEUE_BACKOFF_S=1"]

# Each member: rank 0 listens at PET_MASTER_ADDR:PET_MASTER_PORT, the others connect and send their rank and
# address; rank 0 answers everyone with all of them (an all-gather). `hold` keeps the members running afterwards.
RENDEZVOUS = r"""
import json, os, socket, sys, time
rank, n = int(os.environ["PET_NODE_RANK"]), int(os.environ["PET_NNODES"])
master, port = os.environ["PET_MASTER_ADDR"], int(os.environ["PET_MASTER_PORT"])
me = os.environ["GPUPOOL_NODE_IPS"].split(",")[rank]
if rank == 0:
    server = socket.create_server((master, port))
    server.settimeout(60)
    members, peers = {0: me}, []
    while len(members) < n:
        conn, _ = server.accept()
        hello = json.loads(conn.makefile().readline())
        members[hello["rank"]] = hello["address"]
        peers.append(conn)
    gathered = json.dumps(sorted(members.items()))
    for conn in peers:
        conn.sendall((gathered + "\n").encode())
else:
    deadline = time.monotonic() + 60
    while True:
        try:
            conn = socket.create_connection((master, port), timeout=5, source_address=(me, 0))
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    conn.sendall((json.dumps({"rank": rank, "address": me}) + "\n").encode())
    gathered = conn.makefile().readline().strip()
print(f"rank {rank} of {n} via {master}:{port} gathered {gathered}", flush=True)
if sys.argv[1:] == ["hold"] and os.environ.get("GPUPOOL_ATTEMPT") == "0":
    time.sleep(600)
"""


def gang(api, name: str, *args: str, **fields) -> str:  # type: ignore[no-untyped-def]
    body = {"name": name, "team": "research", "kind": "training", "gpus": 4, "gang_nodes": 2, "gpus_per_node": 2,
            "command": ["python3", "-c", RENDEZVOUS, *args], **fields}
    response = api.post("/v1/jobs", json=body)
    assert response.status_code == 201, response.text
    return response.json()["job_id"]


async def finished(api, job_id: str, timeout: float = 60) -> dict:  # type: ignore[no-untyped-def]
    """(keeps the event loop running: the watchers' messages are taken meanwhile; on a timeout the job as the API
    last showed it, history and pending reason included, goes into the failure)"""
    try:
        return await eventually_async(lambda: (job := api.get(f"/v1/jobs/{job_id}").json())["state"] in (
            "completed", "failed", "cancelled") and job, f"job {job_id} to finish", timeout=timeout)
    except AssertionError as e:
        raise AssertionError(f"{e}; the job: {api.get(f'/v1/jobs/{job_id}').json()}") from e


def work_processes(job_id: str) -> dict[int, dict[str, str]]:
    """The live processes of a job's work on this machine (root reads every environment): pid → environment."""
    found: dict[int, dict[str, str]] = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            raw = (proc / "environ").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        env = dict(item.split("=", 1) for item in raw if "=" in item)
        if env.get("GPUPOOL_JOB_ID") == job_id:
            found[int(proc.name)] = env
    return found


def member_processes(job_id: str) -> dict[int, int]:
    """A gang's live member processes: pid by member rank."""
    return {int(env["PET_NODE_RANK"]): pid for pid, env in work_processes(job_id).items() if "PET_NODE_RANK" in env}


async def test_a_two_node_gang_rendezvouses_over_tcp_with_torchruns_variables(platform) -> None:  # type: ignore[no-untyped-def]
    async with AllocationWatcher(platform.nats_url) as watcher:
        with platform.client() as api:
            finish_all(api)
            job_id = gang(api, "allgather")
            job = await finished(api, job_id)
            assert job["state"] == "completed", job
            granted = sorted((d for _, _, d in watcher.of(AllocationGranted, job_id)), key=lambda d: d.replica)
            assert [g.replica for g in granted] == [0, 1] and granted[0].node != granted[1].node
            # the members started together: each once every member's grant was applied
            started = {d.allocation_id for _, _, d in watcher.of(AllocationGangReady, job_id)}
            assert started == {g.allocation_id for g in granted}
            master = granted[0].environment["PET_MASTER_ADDR"]
            addresses = granted[0].environment["GPUPOOL_NODE_IPS"].split(",")
            assert len(set(addresses)) == 2 and master == addresses[0] and master.startswith("127.0.0.")
            for g in granted:
                e = g.environment
                assert (e["PET_NNODES"], e["PET_NPROC_PER_NODE"], e["PET_NODE_RANK"], e["WORLD_SIZE"]) == (
                    "2", "2", str(g.replica), "2")
                assert (e["MASTER_ADDR"], e["PET_RDZV_ID"]) == (master, job_id)
                assert e["PET_MASTER_PORT"] == granted[0].environment["PET_MASTER_PORT"]
            expected = f'gathered [[0, "{addresses[0]}"], [1, "{addresses[1]}"]]'
            for rank in (0, 1):
                out = api.get(f"/v1/jobs/{job_id}/logs", params={"replica": rank, "stream": "stdout"}).text
                assert f"rank {rank} of 2 via {master}:" in out and expected in out, out
            # the agents' resync hands out the same environment the grant did
            listed = api.get("/v1/allocations", params={"job_id": job_id}).json()["items"]
            assert {a["replica"]: a["environment"] for a in listed} == {g.replica: g.environment for g in granted}


async def test_killing_one_member_fails_the_whole_gang_and_leaves_no_member_running(platform) -> None:  # type: ignore[no-untyped-def]
    async with AllocationWatcher(platform.nats_url) as watcher:
        with platform.client() as api:
            finish_all(api)
            job_id = gang(api, "fragile", "hold")
            wait_state(api, job_id, "running")
            pids = eventually(lambda: (p := member_processes(job_id)) and len(p) == 2 and p,
                              "both members' processes", timeout=30)
            os.kill(pids[1], signal.SIGKILL)
            job = await finished(api, job_id)
            assert (job["state"], job["attempts"]) == ("failed", 0), job
            await eventually_async(lambda: len(watcher.of(AllocationReleased, job_id)) == 2, "both members released")
            reasons = sorted(d.reason for _, _, d in watcher.of(AllocationReleased, job_id))
            assert reasons == ["GangMemberFailed", "WorkFailed"], reasons
            assert member_processes(job_id) == {}, "a member of the failed gang is still running"


async def test_a_gang_restarts_as_one_after_a_member_dies(platform) -> None:  # type: ignore[no-untyped-def]
    with platform.client() as api:
        finish_all(api)
        job_id = gang(api, "resilient", "hold", restart={"policy": "on_failure", "attempts": 1, "delay_s": 0})
        wait_state(api, job_id, "running")
        pids = eventually(lambda: (p := member_processes(job_id)) and len(p) == 2 and p, "both members", timeout=30)
        os.kill(pids[0], signal.SIGKILL)
        started = time.monotonic()
        job = await finished(api, job_id, timeout=90)
        assert (job["state"], job["attempts"]) == ("completed", 1), job
        for rank in (0, 1):  # the second attempt's members found each other again
            out = api.get(f"/v1/jobs/{job_id}/logs", params={"replica": rank, "stream": "stdout"}).text
            assert f"rank {rank} of 2" in out and "gathered" in out, out
        assert time.monotonic() - started < 90
        assert member_processes(job_id) == {}


async def test_losing_one_members_node_stops_the_whole_gang_which_comes_back_as_one(platform) -> None:  # type: ignore[no-untyped-def]
    async with AllocationWatcher(platform.nats_url) as watcher:
        with platform.client() as api:
            finish_all(api)
            job_id = gang(api, "stranded", "hold")
            wait_state(api, job_id, "running")
            eventually(lambda: len(member_processes(job_id)) == 2, "both members' processes", timeout=30)
            granted = await eventually_async(
                lambda: (g := {d.replica: d for _, _, d in watcher.of(AllocationGranted, job_id)}) and len(g) == 2
                and g, "both members' grants seen", timeout=30)
            nc = await nats.connect(platform.nats_url)  # member 1's node stops reporting: inventory declares it lost
            await nc.publish("gpupool.sim.fault", json.dumps(
                {"node": granted[1].node, "fault": "silence", "seconds": 15}).encode())
            await nc.close()
            await eventually_async(lambda: len(watcher.of(AllocationReleased, job_id)) == 2, "both members released",
                                   timeout=60)
            # the surviving member on the other node was stopped too: no member of attempt 0 is left anywhere
            await eventually_async(lambda: not [e for e in work_processes(job_id).values()
                                                if e.get("GPUPOOL_ATTEMPT") == "0"], "attempt 0's members gone",
                                   timeout=30)
            reasons = sorted(d.reason for _, _, d in watcher.of(AllocationReleased, job_id))
            assert reasons == ["NodeLost", "NodeLost"], reasons  # the gang goes whole, for its member's loss
            await eventually_async(lambda: "Requeued:NodeLost" in [
                h["reason"] for h in api.get(f"/v1/jobs/{job_id}").json()["history"]], "the gang requeued", timeout=30)
            # once the node reports again the gang is placed whole and its attempt 1 rendezvouses and completes
            job = await finished(api, job_id, timeout=120)
            assert (job["state"], job["attempts"]) == ("completed", 1), job
            again = [d for _, _, d in watcher.of(AllocationGranted, job_id) if d.attempt == 1]
            assert sorted(d.replica for d in again) == [0, 1], again
            assert member_processes(job_id) == {}


# --- inference services ----------------------------------------------------------------------------------------
SERVER = r"""
import http.server, os
class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = (f"replica {os.environ['GPUPOOL_REPLICA']} restarts {os.environ['GPUPOOL_RESTARTS']} "
                f"version {os.environ.get('VERSION', '1')}").encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
address = (os.environ["GPUPOOL_NODE_ADDRESS"], int(os.environ["PORT"]))
http.server.ThreadingHTTPServer(address, Handler).serve_forever()
"""
HEALTH = {"http": "/healthz", "interval_s": 0.3, "timeout_s": 0.3, "grace_s": 15, "failures": 2}


class EndpointWatcher:
    """A plain core-NATS subscriber on gpupool.endpoint.>, as a load balancer would follow a service."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.events: list[tuple[str, object]] = []

    async def __aenter__(self) -> EndpointWatcher:
        self.nc = await nats.connect(self.url)

        async def on_msg(msg) -> None:  # type: ignore[no-untyped-def]
            envelope = parse_envelope(msg.data)
            self.events.append((envelope.type, decode_data(envelope)))

        await self.nc.subscribe("gpupool.endpoint.>", cb=on_msg)
        await self.nc.flush()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.nc.close()

    def of(self, allocation_id: str) -> list[str]:
        return [t.split(".")[3] for t, d in self.events if getattr(d, "allocation_id", None) == allocation_id]


def service(api, name: str, replicas: int = 2, **fields) -> str:  # type: ignore[no-untyped-def]
    body = {"name": name, "team": "research", "kind": "inference", "gpus": 1, "replicas": replicas,
            "command": ["python3", "-c", SERVER], "ports": ["http"], "health": HEALTH, **fields}
    response = api.post("/v1/jobs", json=body)
    assert response.status_code == 201, response.text
    return response.json()["job_id"]


def ready_endpoints(api, job_id: str) -> list[dict]:  # type: ignore[no-untyped-def]
    response = api.get(f"/v1/jobs/{job_id}/endpoints")
    assert response.status_code == 200, response.text
    return [e for e in response.json()["items"] if e["ready"]]


def fetch(url: str) -> str:
    with urllib.request.urlopen(url + "/", timeout=5) as answer:  # noqa: S310 (the test's own endpoint)
        return answer.read().decode()


def replica_pid(job_id: str, replica: int) -> int | None:
    return next((pid for pid, env in work_processes(job_id).items() if env.get("GPUPOOL_REPLICA") == str(replica)),
                None)


async def test_a_service_comes_up_behind_its_health_check_and_a_killed_replica_is_restarted_in_place(platform) -> None:  # type: ignore[no-untyped-def]
    async with EndpointWatcher(platform.nats_url) as watcher:
        with platform.client() as api:
            finish_all(api)
            job_id = service(api, "echo")
            try:
                ready = await eventually_async(lambda: (r := ready_endpoints(api, job_id)) and len(r) == 2 and r,
                                               "2 ready endpoints", timeout=60)
                for e in ready:  # each answers over HTTP at the URL the API lists
                    assert e["url"].startswith("http://127.0.0.") and e["ports"]["http"] > 0
                    assert fetch(e["url"]) == f"replica {e['replica']} restarts 0 version 1"
                victim = ready[0]
                pid = replica_pid(job_id, victim["replica"])
                assert pid is not None
                os.kill(pid, signal.SIGKILL)
                await eventually_async(lambda: watcher.of(victim["allocation_id"])[-2:] == ["unready", "ready"],
                                       "the killed replica unready, then ready again", timeout=60)
                # the API's endpoint list follows the same events a moment later than this watcher
                same = await eventually_async(
                    lambda: {e["replica"]: e for e in ready_endpoints(api, job_id)}.get(victim["replica"]),
                    "the restarted replica listed ready by the API", timeout=30)
                # restarted on the same allocation, at the same endpoint
                assert (same["allocation_id"], same["url"]) == (victim["allocation_id"], victim["url"])
                assert fetch(same["url"]) == f"replica {victim['replica']} restarts 1 version 1"
                assert watcher.of(victim["allocation_id"]) == ["ready", "unready", "ready"]
            finally:
                api.post(f"/v1/jobs/{job_id}/cancel")
            await eventually_async(lambda: watcher.of(victim["allocation_id"])[-1:] == ["unready"],
                                   "the cancelled replica to leave the endpoint list", timeout=30)


async def test_a_service_scales_on_its_reported_load_within_its_windows_and_drains_what_it_scales_down(platform) -> None:  # type: ignore[no-untyped-def]
    autoscale = {"target": 10, "scale_up_stabilization_s": 0, "scale_down_stabilization_s": 3, "cooldown_s": 1,
                 "sample_ttl_s": 60}
    async with EndpointWatcher(platform.nats_url) as endpoints:
        nc = await nats.connect(platform.nats_url)
        steps: list = []

        async def on_step(msg) -> None:  # type: ignore[no-untyped-def]
            steps.append((time.monotonic(), decode_data(parse_envelope(msg.data))))

        await nc.subscribe("gpupool.job.autoscaled", cb=on_step)
        try:
            with platform.client() as api:
                finish_all(api)
                job_id = service(api, "autoscaled", replicas=2, min_replicas=2, max_replicas=4, autoscale=autoscale)
                try:
                    await eventually_async(lambda: len(ready_endpoints(api, job_id)) == 2, "2 ready", timeout=60)
                    assert api.post(f"/v1/jobs/{job_id}/load", json={"value": 35}).status_code == 202
                    await eventually_async(lambda: len(ready_endpoints(api, job_id)) == 4, "4 ready", timeout=60)
                    up = [s for _, s in steps if s.job_id == job_id]
                    assert [(s.previous, s.replicas) for s in up] == [(2, 4)], up
                    assert up[0].load == 35 and up[0].target == 10 and "wants 4" in up[0].reason
                    reported = time.monotonic()
                    assert api.post(f"/v1/jobs/{job_id}/load", json={"value": 5}).status_code == 202
                    await eventually_async(lambda: len(ready_endpoints(api, job_id)) == 2 and len(
                        api.get(f"/v1/jobs/{job_id}/endpoints").json()["items"]) == 2, "back to 2", timeout=60)
                    down = [(t, s) for t, s in steps if s.job_id == job_id][1:]
                    assert [(s.previous, s.replicas) for _, s in down] == [(4, 2)]
                    waited = down[0][0] - reported
                    # the last high recommendation was at most one evaluation (1 s) before the load fell, and the
                    # down window (3 s) counts from it
                    assert 2 <= waited < 15, f"scaled down {waited:.1f}s after the load fell (window 3 s)"
                    # the replicas scaled away left the endpoint list before their stop
                    drained = [d for _, d in endpoints.events if isinstance(d, EndpointUnready) and d.job_id == job_id]
                    assert {d.replica for d in drained} == {2, 3} and {d.reason for d in drained} == {"Draining"}
                    history = [h["reason"] for h in api.get(f"/v1/jobs/{job_id}").json()["history"]]
                    assert "Autoscaled:2->4" in history and "Autoscaled:4->2" in history
                    described = _cli(platform, "describe", job_id)
                    assert described.returncode == 0 and "Autoscaled:4->2" in described.stdout, described.stdout
                finally:
                    api.post(f"/v1/jobs/{job_id}/cancel")
        finally:
            await nc.close()


async def test_a_service_of_one_replica_scales_from_one_and_back_and_rolls_without_a_gap(platform) -> None:  # type: ignore[no-untyped-def]
    autoscale = {"target": 10, "scale_up_stabilization_s": 0, "scale_down_stabilization_s": 2, "cooldown_s": 1}
    with platform.client() as api:
        finish_all(api)
        job_id = service(api, "solo", replicas=1, min_replicas=1, max_replicas=3, autoscale=autoscale)
        try:
            first = await eventually_async(lambda: (r := ready_endpoints(api, job_id)) and r, "1 ready", timeout=60)
            assert [e["replica"] for e in first] == [0]
            assert api.post(f"/v1/jobs/{job_id}/load", json={"value": 25}).status_code == 202
            await eventually_async(lambda: len(ready_endpoints(api, job_id)) == 3, "3 ready", timeout=60)
            assert api.post(f"/v1/jobs/{job_id}/load", json={"value": 0}).status_code == 202
            await eventually_async(lambda: len(api.get(f"/v1/jobs/{job_id}/endpoints").json()["items"]) == 1,
                                   "back to 1", timeout=60)
            kept = ready_endpoints(api, job_id)
            # the replica it started with is the one kept: a service of one is still a replica set
            assert [(e["replica"], e["allocation_id"]) for e in kept] == [(0, first[0]["allocation_id"])]
            job = api.get(f"/v1/jobs/{job_id}").json()
            assert job["state"] == "running" and job["replicas"] == 1, job
            assert api.patch(f"/v1/jobs/{job_id}", json={"env": {"VERSION": "2"}}).status_code == 200
            fewest, deadline = 1, time.monotonic() + 60
            while time.monotonic() < deadline:  # sampled every 100 ms: one replica ready throughout
                ready = ready_endpoints(api, job_id)
                fewest = min(fewest, len(ready))
                answers = []
                for e in ready:
                    with contextlib.suppress(OSError):
                        answers.append(fetch(e["url"]))
                if answers and all(a.endswith("version 2") for a in answers) and len(
                        api.get(f"/v1/jobs/{job_id}/endpoints").json()["items"]) == 1:
                    break
                await asyncio.sleep(0.1)
            else:
                raise AssertionError(f"the update did not finish in 60 s: {ready_endpoints(api, job_id)}")
            assert fewest >= 1, "no replica was ready at one point during the update"
        finally:
            api.post(f"/v1/jobs/{job_id}/cancel")


# A replica whose load the test sets through a file: it keeps a CPU core busy `<load>`% of the time (on the simulated
# fleet a replica's CPU use is its GPU's utilisation) and serves the load as a Prometheus metric.
LOADED = r"""
import http.server, os, threading, time
path = os.environ["LOAD_FILE"]
def load():
    try:
        return float(open(path).read().strip() or 0)
    except (OSError, ValueError):
        return 0.0
def burn():
    while True:
        duty, began = min(1.0, load() / 100), time.monotonic()
        while time.monotonic() - began < 0.1 * duty:
            pass
        time.sleep(0.1 * (1 - duty))
threading.Thread(target=burn, daemon=True).start()
class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = (f"# HELP requests_in_flight requests being served\n# TYPE requests_in_flight gauge\n"
                f"requests_in_flight{{replica=\"{os.environ['GPUPOOL_REPLICA']}\"}} {load():g}\n").encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
http.server.ThreadingHTTPServer((os.environ["GPUPOOL_NODE_ADDRESS"], int(os.environ["PORT"])), Handler).serve_forever()
"""


async def _scales_2_4_2_on_what_the_agents_sample(platform, name: str, autoscale: dict, high: str,  # type: ignore[no-untyped-def]
                                                  low: str) -> list:
    """A 2..4 service whose load file says `high` scales to 4, then on `low` back to 2: the job.autoscaled steps."""
    load_dir = Path(tempfile.mkdtemp(prefix="gpupool-load-"))
    load_dir.chmod(0o755)
    load_file = load_dir / "load"
    load_file.write_text("0")
    load_file.chmod(0o644)
    nc = await nats.connect(platform.nats_url)
    steps: list = []

    async def on_step(msg) -> None:  # type: ignore[no-untyped-def]
        steps.append(decode_data(parse_envelope(msg.data)))

    await nc.subscribe("gpupool.job.autoscaled", cb=on_step)
    try:
        with platform.client() as api:
            finish_all(api)
            job_id = service(api, name, replicas=2, min_replicas=2, max_replicas=4, autoscale=autoscale,
                             command=["python3", "-c", LOADED], env={"LOAD_FILE": str(load_file)})
            try:
                await eventually_async(lambda: len(ready_endpoints(api, job_id)) == 2, "2 ready", timeout=60)
                pushed = api.post(f"/v1/jobs/{job_id}/load", json={"value": 35})
                assert pushed.status_code == 409 and pushed.json()["reason"] == "LoadNotPushed", pushed.text
                load_file.write_text(high)
                await eventually_async(lambda: len(ready_endpoints(api, job_id)) == 4, "4 ready", timeout=60)
                load_file.write_text(low)
                await eventually_async(lambda: len(ready_endpoints(api, job_id)) == 2 and len(
                    api.get(f"/v1/jobs/{job_id}/endpoints").json()["items"]) == 2, "back to 2", timeout=60)
                history = [h["reason"] for h in api.get(f"/v1/jobs/{job_id}").json()["history"]]
                scaled = [h for h in history if h.startswith("Autoscaled:")]
                assert scaled[0].startswith("Autoscaled:2->") and "->4" in " ".join(scaled) and scaled[-1].endswith(
                    "->2"), history
            finally:
                api.post(f"/v1/jobs/{job_id}/cancel")
                shutil.rmtree(load_dir, ignore_errors=True)
    finally:
        await nc.close()
    return [s for s in steps if s.job_id == job_id]


def _up_then_down(steps: list) -> tuple:
    """Up from 2 to 4, then down to 2, each way in one step or more (while the replicas' samples of the window
    still differ, the up window keeps their lowest recommendation and the down window their highest): the step
    that reached 4 and the last."""
    moves = [(s.previous, s.replicas) for s in steps]
    top = next((i for i, (_, b) in enumerate(moves) if b == 4), None)
    assert top is not None and moves[0][0] == 2 and moves[-1][1] == 2, moves
    assert all(a < b for a, b in moves[:top + 1]) and all(a > b for a, b in moves[top + 1:]), moves
    assert all(moves[i][1] == moves[i + 1][0] for i in range(len(moves) - 1)), moves
    return steps[top], steps[-1]


async def test_a_service_scales_on_its_replicas_gpu_utilisation_from_telemetry(platform) -> None:  # type: ignore[no-untyped-def]
    # each replica busy 25% of a core = its GPU 25% utilised: 2 × 25 over a target of 12 wants 4 (at most 4)
    autoscale = {"signal": "gpu_utilization", "target": 12, "sample_every_s": 1, "sample_ttl_s": 5,
                 "scale_up_stabilization_s": 2, "scale_down_stabilization_s": 3, "cooldown_s": 1}
    steps = await _scales_2_4_2_on_what_the_agents_sample(platform, "gpu-scaled", autoscale, high="25", low="0")
    up, down = _up_then_down(steps)
    assert up.signal == "gpu_utilization" and up.load > 36 and "GPU utilisation" in up.reason, up
    assert down.load < 24, down  # idle replicas: their GPUs' utilisation ~0


async def test_a_service_scales_on_a_metric_its_agents_scrape_from_each_replica(platform) -> None:  # type: ignore[no-untyped-def]
    autoscale = {"signal": "metric", "metric": "requests_in_flight", "target": 10, "sample_every_s": 1,
                 "sample_ttl_s": 5, "scale_up_stabilization_s": 0, "scale_down_stabilization_s": 3, "cooldown_s": 1}
    steps = await _scales_2_4_2_on_what_the_agents_sample(platform, "metric-scaled", autoscale, high="20", low="1")
    up, down = _up_then_down(steps)
    assert up.signal == "metric" and up.load > 30 and "requests_in_flight" in up.reason, up  # 20 per replica
    assert down.load <= 4, down  # at most 4 replicas at 1 each (the ones scaled away no longer count)


def _cli(platform, *args: str) -> subprocess.CompletedProcess:  # type: ignore[no-untyped-def]
    env = {**os.environ, "GPUPOOL_URL": platform.gateway, "GPUPOOL_TOKEN": platform.run["admin_token"]}
    return subprocess.run([sys.executable, "-m", "libs.cli.main", *args], env=env, capture_output=True, text=True,
                          timeout=60)


async def test_a_rolling_update_keeps_the_replicas_ready_throughout(platform) -> None:  # type: ignore[no-untyped-def]
    with platform.client() as api:
        finish_all(api)
        job_id = service(api, "rolled", replicas=2, min_replicas=2, max_replicas=4)
        try:
            await eventually_async(lambda: len(ready_endpoints(api, job_id)) == 2, "2 ready", timeout=60)
            updated = api.patch(f"/v1/jobs/{job_id}", json={"env": {"VERSION": "2"}})
            assert updated.status_code == 200, updated.text
            assert updated.json()["work"]["env"] == {"VERSION": "2"}
            fewest, deadline = 2, time.monotonic() + 90
            while time.monotonic() < deadline:  # sampled every 100 ms until every replica serves version 2
                ready = ready_endpoints(api, job_id)
                fewest = min(fewest, len(ready))
                answers = []
                for e in ready:
                    try:
                        answers.append(fetch(e["url"]))
                    except OSError:
                        answers.append("")  # listed ready while already going: counted as not serving
                assert sum(a.endswith("version 2") or a.endswith("version 1") for a in answers) >= 2 or len(
                    ready) < 2, answers
                if len(ready) == 2 and all(a.endswith("version 2") for a in answers):
                    items = api.get(f"/v1/jobs/{job_id}/endpoints").json()["items"]
                    if len(items) == 2:
                        break
                await asyncio.sleep(0.1)
            else:
                raise AssertionError(f"the update did not finish in 90 s: {ready_endpoints(api, job_id)}")
            assert fewest >= 2, f"only {fewest} replicas were ready at one point (min_replicas 2)"
            history = [h["reason"] for h in api.get(f"/v1/jobs/{job_id}").json()["history"]]
            assert "WorkUpdated:1" in history
            single = api.post("/v1/jobs", json={"name": "single", "team": "research", "gpus": 1,
                                                "command": ["sleep", "30"]}).json()["job_id"]
            refused = api.patch(f"/v1/jobs/{single}", json={"env": {"VERSION": "2"}})
            assert refused.status_code == 409 and refused.json()["reason"] == "NotRollable", refused.text
            api.post(f"/v1/jobs/{single}/cancel")
        finally:
            api.post(f"/v1/jobs/{job_id}/cancel")


# --- torchrun ----------------------------------------------------------------------------------------------------
ALLREDUCE = r"""
import os, torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(t)
line = f"rank {dist.get_rank()} of {dist.get_world_size()} all_reduce {t.item():g}\n"
os.write(1, line.encode())  # one write: a node's workers share its stdout
dist.destroy_process_group()
"""


def torch_for_the_work() -> str:
    """A directory the work's /usr/bin/python3 imports torch from (PYTHONPATH): GPUPOOL_TEST_TORCH_DIR, or one
    installed once into .venv/torch-cpu from a CPU wheel this machine has (pip's find-links); else skip."""
    given = os.environ.get("GPUPOOL_TEST_TORCH_DIR")
    if given:
        return given
    target = Path(sys.prefix) / "torch-cpu"
    if (target / "torch" / "__init__.py").exists():
        return str(target)
    if subprocess.run(["/usr/bin/python3", "-c", "import sys; assert sys.version_info[:2] == (3, 11)"],
                      capture_output=True).returncode != 0:
        pytest.skip("torchrun test: the work's /usr/bin/python3 is not 3.11, so the CPU wheel cannot serve it")
    links = subprocess.run([sys.executable, "-m", "pip", "config", "get", "global.find-links"],
                           capture_output=True, text=True).stdout.split()
    wheels = sorted(w for d in links if Path(d).is_dir() for w in Path(d).glob("torch-*+cpu-cp311-*.whl"))
    if not wheels:
        pytest.skip("torchrun test: no torch for /usr/bin/python3 and no CPU wheel on this machine (a CUDA build "
                    "is several GB); set GPUPOOL_TEST_TORCH_DIR to a `pip install --target` directory of torch")
    if shutil.disk_usage(sys.prefix).free < 3 * 2**30:
        pytest.skip("torchrun test: less than 3 GiB free for torch's CPU build (about 0.9 GiB installed)")
    done = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--target", str(target), str(wheels[-1])],
                          capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        shutil.rmtree(target, ignore_errors=True)
        pytest.skip(f"torchrun test: installing torch's CPU wheel failed: {done.stderr[-300:]}")
    return str(target)


async def test_torchrun_all_reduces_with_gloo_across_the_gangs_two_simulated_nodes(platform) -> None:  # type: ignore[no-untyped-def]
    torch_dir = torch_for_the_work()
    where = Path(tempfile.mkdtemp(prefix="gpupool-ddp-"))
    script = where / "allreduce.py"
    script.write_text(ALLREDUCE)
    for path in (where, script):
        path.chmod(0o755)  # the work runs as nobody (pytest's tmp_path is root's alone)
    with platform.client() as api:
        finish_all(api)
        body = {"name": "ddp", "team": "research", "kind": "training", "gpus": 4, "gang_nodes": 2,
                "gpus_per_node": 2, "env": {"PYTHONPATH": torch_dir},
                "command": ["python3", "-m", "torch.distributed.run", str(script)]}
        response = api.post("/v1/jobs", json=body)
        assert response.status_code == 201, response.text
        job_id = response.json()["job_id"]
        job = await finished(api, job_id, timeout=180)
        out = {rank: api.get(f"/v1/jobs/{job_id}/logs", params={"replica": rank, "stream": "stdout"}).text
               for rank in (0, 1)}
        errs = {rank: api.get(f"/v1/jobs/{job_id}/logs", params={"replica": rank, "stream": "stderr", "tail": 60}).text for rank in (0, 1)}
        assert job["state"] == "completed", (job["reason"], job["message"], out, errs)
        # torchrun made 2 workers per node from PET_NPROC_PER_NODE: ranks 0-3, each summed 1+2+3+4
        lines = sorted(re.findall(r"rank \d+ of \d+ all_reduce [0-9.]+", "\n".join(out.values())))
        assert lines == [f"rank {r} of 4 all_reduce 10" for r in range(4)], out



# --- the seed's second scenario: inference and training share the pool, peak and trough --------------------------
TRAIN = """
import os, signal, sys, time
rank = os.environ["PET_NODE_RANK"]
ck = os.path.join(os.environ["GPUPOOL_CHECKPOINT_DIR"], f"step-{rank}")
step = int(open(ck).read()) if os.path.exists(ck) else 0
print(f"attempt {os.environ['GPUPOOL_ATTEMPT']} resumed from step {step}", flush=True)
def save(*_):
    open(ck, "w").write(str(step))
    print(f"checkpointed at step {step}", flush=True)
    sys.exit(0)
signal.signal(signal.SIGTERM, save)
while step < 60:
    step += 1
    time.sleep(0.1)
open(ck, "w").write(str(step))
print(f"done at step {step}", flush=True)
"""


async def test_night_and_morning_inference_lends_its_gpus_to_training_and_takes_them_back(platform) -> None:  # type: ignore[no-untyped-def]
    """推理服务和训练任务混跑: the service scales down at night, preemptible training borrows the GPUs and runs; in
    the morning the service scales back up, preempting the training with its checkpoint signal; the training
    resumes from its checkpoint when capacity returns. Reports what training gained and the service's time below
    target; `gpupool check` is green at the end."""
    autoscale = {"target": 10, "scale_up_stabilization_s": 0, "scale_down_stabilization_s": 2, "cooldown_s": 1,
                 "sample_ttl_s": 120}
    with platform.client() as api:
        finish_all(api)
        svc = service(api, "chat", replicas=6, min_replicas=2, max_replicas=6, autoscale=autoscale,
                      priority_class="production-inference")
        try:
            load = lambda value: api.post(f"/v1/jobs/{svc}/load", json={"value": value})  # noqa: E731
            assert load(60).status_code == 202  # day: 6 replicas' worth
            await eventually_async(lambda: len(ready_endpoints(api, svc)) == 6, "6 ready by day", timeout=90)
            train = api.post("/v1/jobs", json={
                "name": "pretrain", "team": "research", "kind": "training", "priority_class": "normal",
                "gpus": 4, "gang_nodes": 2, "gpus_per_node": 2, "stop_grace_s": 10,
                "command": ["python3", "-c", TRAIN]}).json()["job_id"]
            await asyncio.sleep(2)
            assert api.get(f"/v1/jobs/{train}").json()["state"] == "pending", "training ran beside the day's peak"
            assert load(5).status_code == 202  # night
            await eventually_async(lambda: api.get(f"/v1/jobs/{train}").json()["state"] == "running",
                                   "the training to borrow the night's GPUs", timeout=60)
            assert len(api.get(f"/v1/jobs/{svc}/endpoints").json()["items"]) == 2  # down to min_replicas
            await asyncio.sleep(3)  # it trains
            rose = time.monotonic()
            assert load(60).status_code == 202  # morning
            await eventually_async(lambda: len(ready_endpoints(api, svc)) == 6, "6 ready again", timeout=90)
            below_target_s = time.monotonic() - rose
            job = api.get(f"/v1/jobs/{train}").json()
            assert job["state"] == "pending" and job["attempts"] >= 1, job  # preempted, requeued
            assert "PreemptedByPriority" in [h["reason"] for h in job["history"]], job["history"]
            assert load(5).status_code == 202  # night again: capacity returns
            done = await finished(api, train, timeout=120)
            assert done["state"] == "completed", done
            out = api.get(f"/v1/jobs/{train}/logs", params={"replica": 0, "stream": "stdout"}).text
            resumed = int(out.split("resumed from step ")[1].split()[0])
            assert done["attempts"] >= 1 and resumed > 0 and "done at step 60" in out, out
            rows = api.get("/v1/usage", params={"job_id": train, "limit": 1000}).json()["items"]
            gained_gpu_h = sum(r["gpu_seconds"] for r in rows) / 3600
            assert gained_gpu_h > 0
            print(f"\ntraining gained {gained_gpu_h * 3600:.0f} GPU-seconds ({gained_gpu_h:.4f} GPU-h) at night; "
                  f"resumed from step {resumed}; the service was below its target for {below_target_s:.1f} s "
                  "in the morning")
        finally:
            api.post(f"/v1/jobs/{svc}/cancel")
    with platform.client() as api:
        finish_all(api)
    report = await check_async(CheckConfig.from_run_file(platform.data_dir / "run.json"))  # `gpupool check`
    assert report.ok, report.to_text()
