"""Time-boxed quota loans through the approval flow, on a real `gpupool up`: a team admin asks for extra guarantee
until a date, only a platform admin may grant it, the waiting job runs once it is granted, and when the date
passes the guarantee drops back (announced as quota.set) and new work waits again."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime, timedelta

import httpx
import nats
import pytest
from support import AllocationWatcher, finish_all

from libs.client import GpupoolClient
from libs.contracts.envelope import parse_envelope
from libs.contracts.events import AllocationGranted, QuotaSet, decode_data

pytestmark = pytest.mark.e2e
FLEET_NODES = 1
UP_ARGS = ["--fleet", "H100-80GB*8", "--env", "quota:LOAN_SWEEP_INTERVAL_S=0.5"]


def post_job(api, name: str) -> str:  # type: ignore[no-untyped-def]
    response = api.post("/v1/jobs", json={"name": name, "team": "research", "gpus": 1})
    assert response.status_code == 201, response.text
    return response.json()["job_id"]


async def reason_of(api, job_id: str, want: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + 15
    while api.get(f"/v1/jobs/{job_id}/explain").json()["placement"].get("reason") != want:
        assert time.monotonic() < deadline, api.get(f"/v1/jobs/{job_id}/explain").json()
        await asyncio.sleep(0.2)


async def test_a_quota_loan_is_approved_by_an_admin_lets_waiting_work_run_and_ends_on_its_date(platform) -> None:  # type: ignore[no-untyped-def]
    quota_events: list[QuotaSet] = []
    nc = await nats.connect(platform.nats_url)

    async def on_quota(msg) -> None:  # type: ignore[no-untyped-def]
        data = decode_data(parse_envelope(msg.data))
        if isinstance(data, QuotaSet) and data.path == "default/research":
            quota_events.append(data)

    await nc.subscribe("gpupool.quota.set", cb=on_quota)
    try:
        async with AllocationWatcher(platform.nats_url) as watch:
            with platform.client() as api:
                finish_all(api)
                assert api.put("/v1/quotas", json={"path": "default/research", "guaranteed": 1,
                                                   "borrowing_limit": 0}).status_code == 200
                tokens = {role: api.post("/v1/tokens", json={"name": f"loan-{role}", "role": role,
                                                               "team": "research"}).json()["token"]
                          for role in ("team-admin", "member")}

                def as_(role: str) -> httpx.Client:
                    return httpx.Client(base_url=platform.gateway, timeout=10,
                                        headers={"Authorization": f"Bearer {tokens[role]}"})

                first, second = post_job(api, "first"), post_job(api, "second")
                await watch.wait_for(AllocationGranted, first)
                await reason_of(api, second, "QuotaExceeded")

                until = datetime.now(UTC) + timedelta(seconds=15)
                loan = {"path": "default/research", "gpus": 1, "until": until.isoformat(), "reason": "deadline"}
                with as_("member") as member:
                    assert member.post("/v1/quota-loans", json=loan).status_code == 403
                with as_("team-admin") as lead:
                    other = lead.post("/v1/quota-loans", json={**loan, "path": "default/inference"})
                    assert other.status_code == 403
                    asked = lead.post("/v1/quota-loans", json=loan)
                    assert asked.status_code == 201, asked.text
                    request = asked.json()
                    assert request["kind"] == "loan" and request["state"] == "pending"
                    # a team admin approves their team's jobs, but never lends their own team guarantee
                    assert lead.post(f"/v1/approvals/{request['approval_id']}/approve").status_code == 403
                pending = api.get("/v1/approvals", params={"kind": "loan", "state": "pending"}).json()["items"]
                assert [p["approval_id"] for p in pending] == [request["approval_id"]]
                with GpupoolClient(platform.gateway, platform.run["admin_token"]) as gp:  # a loan has no job
                    assert [a.approval_id for a in gp.list_approvals(state="pending", kind="job")] == []
                    [listed] = [a for a in gp.list_approvals(state="pending") if a.approval_id == request["approval_id"]]
                    assert (listed.kind, listed.job_id, listed.loan_path, listed.gpus) == (
                        "loan", None, "default/research", 1) and listed.loan_until is not None
                await asyncio.sleep(1.0)
                assert watch.of(AllocationGranted, second) == []

                approved = api.post(f"/v1/approvals/{request['approval_id']}/approve", json={"comment": "ok"})
                assert approved.status_code == 200, approved.text
                await watch.wait_for(AllocationGranted, second)
                [active] = api.get("/v1/quota-loans", params={"active": "true"}).json()["items"]
                assert active["path"] == "default/research" and active["gpus"] == 1
                research = next(t for t in api.get("/v1/teams").json()["items"] if t["team"] == "research")
                entry = next(q for q in research["quotas"] if q["path"] == "default/research")
                assert (entry["guaranteed"], entry["loaned"]) == (2, 1)
                assert any(e.guaranteed == 2 and e.loaned == 1 for e in quota_events)

                # the date passes: the guarantee drops back, announced; new work waits again
                deadline = time.monotonic() + 30
                while api.get("/v1/quota-loans", params={"active": "true"}).json()["items"]:
                    assert time.monotonic() < deadline, "the loan never ended"
                    await asyncio.sleep(0.5)
                deadline = time.monotonic() + 10
                while not (quota_events and quota_events[-1].guaranteed == 1 and quota_events[-1].loaned == 0):
                    assert time.monotonic() < deadline, quota_events[-3:]
                    await asyncio.sleep(0.2)
                third = post_job(api, "third")
                await reason_of(api, third, "QuotaExceeded")
                api.put("/v1/quotas", json={"path": "default/research", "guaranteed": 0, "borrowing_limit": None})
                finish_all(api)
    finally:
        await nc.close()
