"""`GET /v1/events`: live CloudEvents over server-sent events, filtered by type and by what the caller may see."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections import Counter

import httpx
import nats
import pytest
from cloudevents.core.formats.json import JSONFormat
from cloudevents.core.v1.event import CloudEvent as SdkCloudEvent
from nats.aio.msg import Msg

from libs.contracts import subjects
from libs.contracts.bus_map import CLOUDEVENT_SUBJECTS, NOT_EVENTS
from libs.contracts.envelope import schema_of
from libs.contracts.events import EVENT_TYPES

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


async def test_a_plain_nats_client_on_the_documented_wildcards_receives_only_cloudevents(platform) -> None:  # type: ignore[no-untyped-def]
    """docs/asyncapi.yaml names the subjects that carry the events (CLOUDEVENT_SUBJECTS): a plain subscriber there
    reads every message with the official CloudEvents SDK while one job runs, and everything else on `gpupool.>`
    is request/reply or internal traffic under the prefixes the document names (NOT_EVENTS)."""
    nc = await nats.connect(platform.nats_url)
    events: list[tuple[str, bytes]] = []
    everything: list[str] = []
    try:
        async def on_event(msg: Msg) -> None:
            events.append((msg.subject, msg.data))

        async def on_any(msg: Msg) -> None:
            everything.append(msg.subject)

        for pattern in CLOUDEVENT_SUBJECTS:
            await nc.subscribe(pattern, cb=on_event)
        await nc.subscribe("gpupool.>", cb=on_any)
        async with httpx.AsyncClient(base_url=platform.gateway, timeout=10, headers={
                "Authorization": f"Bearer {platform.run['admin_token']}"}) as api:
            job = await api.post("/v1/jobs", json={"name": "ce-sdk", "team": "research", "gpus": 1})
            assert job.status_code == 201, job.text
            job_id = job.json()["job_id"]
            await _until(api, job_id, "running")
            assert (await api.post(f"/v1/jobs/{job_id}/complete")).status_code == 200
            await asyncio.sleep(3)  # the release and a few telemetry samples arrive
        await nc.flush()
    finally:
        await nc.close()

    parsed = [_read_with_the_sdk(subject, raw) for subject, raw in events]
    types = Counter(event.get_type() for event in parsed)
    print(f"CloudEvents SDK parsed {len(parsed)} of {len(events)} messages on {len(CLOUDEVENT_SUBJECTS)} "
          f"wildcards: {dict(types)}")
    assert len(parsed) == len(events) > 0
    assert {"io.gpupool.job.submitted.v1", "io.gpupool.allocation.granted.v1", "io.gpupool.job.completed.v1",
            "io.gpupool.allocation.released.v1", "io.gpupool.telemetry.sampled.v1"} <= set(types)
    others = [s for s in everything if not any(subjects.matches(p, s) for p in CLOUDEVENT_SUBJECTS)]
    assert others, "the gateway's requests travel on gpupool.> too"
    assert all(any(subjects.matches(p, s) for p in NOT_EVENTS) for s in others), set(others)
    assert len(everything) == len(events) + len(others)


async def _until(api: httpx.AsyncClient, job_id: str, state: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (await api.get(f"/v1/jobs/{job_id}")).json().get("state") == state:
            return
        await asyncio.sleep(0.2)
    raise AssertionError(f"job {job_id} never reached {state}")


def _read_with_the_sdk(subject: str, raw: bytes) -> SdkCloudEvent:
    """One message through the official SDK's JSON format (which validates the required attributes), then the
    attributes gpupool promises on every event: specversion 1.0 on the wire, a known type and its dataschema."""
    event = JSONFormat().read(SdkCloudEvent, raw)
    assert json.loads(raw)["specversion"] == "1.0", subject
    assert event.get_id() and event.get_source().startswith("/gpupool/") and event.get_time() is not None
    assert event.get_type() in EVENT_TYPES, (subject, event.get_type())
    assert event.get_dataschema() == schema_of(event.get_type()), subject
    assert event.get_datacontenttype() == "application/json" and isinstance(event.get_data(), dict)
    return event
