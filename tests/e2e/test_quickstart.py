"""The README's first command, as a user runs it: `gpupool up` with no servers given starts its own NATS (with
per-service credentials) and PostgreSQL, serves a job, and `gpupool down` leaves no process behind."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from urllib.parse import urlsplit

import httpx
import nats
import pytest

from libs.contracts.envelope import parse_envelope
from libs.contracts.events import AllocationGranted, decode_data

pytestmark = pytest.mark.e2e


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except FileNotFoundError:
        return False


async def test_gpupool_up_on_its_own_servers_places_a_job_and_down_stops_every_process(tmp_path) -> None:  # type: ignore[no-untyped-def]
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPOOL_")}
    cli = [sys.executable, "-m", "libs.cli.main"]
    with open(tmp_path / "up.out", "wb") as out:
        up = subprocess.Popen([*cli, "up", "--port", "0", "--data-dir", str(tmp_path), "--fleet", "L40S*4"],
                              env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while not (tmp_path / "run.json").exists():
            assert up.poll() is None and time.monotonic() < deadline, (tmp_path / "up.out").read_text()
            await asyncio.sleep(0.2)
        run = json.loads((tmp_path / "run.json").read_text())
        assert run["nats_auth"] is True and set(run["servers"]) == {"nats", "postgres"}
        creds = run["nats_credentials"]  # one nkey identity per service and node, plus supervisor and observer
        assert set(creds) == {"inventory", "quota", "queue", "placement", "reclamation", "accounting", "gateway",
                              "supervisor", "observer", "agent-local-sim-node-0"}  # --fleet L40S*4: one node
        assert all(os.stat(p).st_mode & 0o777 == 0o600 for p in creds.values())

        seen: list[AllocationGranted] = []
        nc = await nats.connect(run["nats_url"])  # admin credentials from run.json

        async def on_msg(msg) -> None:  # type: ignore[no-untyped-def]
            data = decode_data(parse_envelope(msg.data))
            if isinstance(data, AllocationGranted):
                seen.append(data)

        await nc.subscribe("gpupool.allocation.>", cb=on_msg)
        headers = {"Authorization": f"Bearer {run['admin_token']}"}
        async with httpx.AsyncClient(base_url=run["gateway_url"], headers=headers, timeout=10) as api:
            job_id = None
            while job_id is None and time.monotonic() < deadline:
                nodes = (await api.get("/v1/nodes")).json().get("items", [])
                if nodes:
                    response = await api.post("/v1/jobs", json={"name": "quick", "team": "research", "gpus": 4})
                    assert response.status_code == 201, response.text
                    job_id = response.json()["job_id"]
                else:
                    await asyncio.sleep(0.2)
            while not any(a.job_id == job_id for a in seen) and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            granted = [a for a in seen if a.job_id == job_id]
            assert len(granted) == 1 and len(granted[0].gpus) == 4 and granted[0].gpus[0].model == "L40S"
            # exercise the policy path under per-service credentials too (quota → placement events)
            assert (await api.put("/v1/quotas", json={"path": "default/research", "guaranteed": 2})).status_code == 200
            assert (await api.post(f"/v1/jobs/{job_id}/complete")).status_code == 200
            # work runs under per-node identities: the agent registers, starts and reports on its own subjects
            ran = (await api.post("/v1/jobs", json={"name": "quick-work", "team": "research", "gpus": 1,
                                                    "command": ["true"]})).json()["job_id"]
            while (await api.get(f"/v1/jobs/{ran}")).json()["state"] != "completed":
                assert time.monotonic() < deadline, (await api.get(f"/v1/jobs/{ran}")).json()
                await asyncio.sleep(0.1)
            await asyncio.sleep(1.0)
        await nc.close()
        # each service reaches PostgreSQL as its own role, with a password; nothing printed carries a secret
        assert {s: urlsplit(u).username for s, u in run["database_urls"].items()} == {
            s: f"gpupool_{s}" for s in run["database_urls"]}
        assert all(urlsplit(u).password for u in run["database_urls"].values()) and run["postgres_durable"] is True
        status = subprocess.run([*cli, "status", "--data-dir", str(tmp_path)], env=env, capture_output=True,
                                text=True, timeout=30)
        secrets = [urlsplit(u).password for u in [*run["database_urls"].values(), run["nats_url"].split(",")[0]]]
        printed = status.stdout + (tmp_path / "up.out").read_text()
        assert "***@" in status.stdout and not [s for s in [*secrets, run["admin_token"]] if s in printed]
        log = (tmp_path / "logs" / "nats-server.log").read_text(errors="replace")
        # nats-server logs "Publish Violation" / "Subscription Violation" for anything a service user may not do
        assert "Violation" not in log, [line for line in log.splitlines() if "Violation" in line][:5]

        pids = [s["pid"] for s in run["services"].values()] + [s["pid"] for s in run["servers"].values()]
        down = subprocess.run([*cli, "down", "--data-dir", str(tmp_path)], env=env, capture_output=True, text=True,
                              timeout=90)
        assert down.returncode == 0, down.stdout + down.stderr
        assert up.wait(timeout=30) == 0
        deadline = time.monotonic() + 10
        while any(alive(p) for p in pids) and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        assert [p for p in pids if alive(p)] == []
        assert not (tmp_path / "run.json").exists()
    finally:
        if up.poll() is None:  # a failed assertion: stop the stack the way a user would, not by SIGKILL
            up.send_signal(signal.SIGTERM)
            try:
                up.wait(timeout=60)
            except subprocess.TimeoutExpired:
                up.kill()
