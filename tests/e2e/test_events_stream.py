"""`GET /v1/events`: live CloudEvents over server-sent events, filtered by type and by what the caller may see."""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest

pytestmark = pytest.mark.e2e


def read_events(url: str, token: str, params: dict, out: list[dict], ready: threading.Event) -> None:
    headers = {"Authorization": f"Bearer {token}"}
    with httpx.stream("GET", f"{url}/v1/events", params=params, headers=headers, timeout=30) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        event: dict = {}
        for line in response.iter_lines():
            ready.set()
            if line.startswith("id: "):
                event["id"] = line[4:]
            elif line.startswith("event: "):
                event["event"] = line[7:]
            elif line.startswith("data: "):
                event["data"] = json.loads(line[6:])
            elif line == "" and event:
                out.append(event)
                event = {}


def test_a_member_sees_only_their_teams_events_of_the_types_asked_for(platform) -> None:  # type: ignore[no-untyped-def]
    with platform.client() as admin:
        member = admin.post("/v1/tokens", json={"name": "sse", "role": "member", "team": "research"}).json()["token"]
        seen: list[dict] = []
        ready = threading.Event()
        reader = threading.Thread(target=read_events, args=(
            platform.gateway, member, {"type": ["io.gpupool.job.submitted", "io.gpupool.allocation"],
                                       "max_seconds": 6}, seen, ready), daemon=True)
        reader.start()
        assert ready.wait(10)
        time.sleep(0.3)  # the gateway has subscribed once the stream's first bytes arrived
        ours = admin.post("/v1/jobs", json={"name": "sse-ours", "team": "research", "gpus": 1}).json()["job_id"]
        theirs = admin.post("/v1/jobs", json={"name": "sse-theirs", "team": "inference", "gpus": 1}).json()["job_id"]
        reader.join(timeout=15)
    assert not reader.is_alive(), "the stream closes after max_seconds"
    job_ids = {e["data"]["data"]["job_id"] for e in seen}
    types = {e["event"] for e in seen}
    assert ours in job_ids and theirs not in job_ids
    assert types <= {"io.gpupool.job.submitted.v1", "io.gpupool.allocation.granted.v1",
                     "io.gpupool.allocation.released.v1"}
    assert "io.gpupool.job.submitted.v1" in types and "io.gpupool.allocation.granted.v1" in types
    assert all(e["id"] == e["data"]["id"] and e["data"]["specversion"] == "1.0" for e in seen)


def test_asking_for_another_teams_events_is_forbidden(platform) -> None:  # type: ignore[no-untyped-def]
    with platform.client() as admin:
        viewer = admin.post("/v1/tokens", json={"name": "sse-v", "role": "viewer", "team": "research"}).json()["token"]
    response = httpx.get(f"{platform.gateway}/v1/events", params={"team": "inference"},
                         headers={"Authorization": f"Bearer {viewer}"})
    assert response.status_code == 403 and response.json()["reason"] == "Forbidden"
