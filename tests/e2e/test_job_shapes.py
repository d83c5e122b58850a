"""Gangs and replicas through real processes: a 16-GPU gang over two nodes is placed all or nothing while smaller
jobs backfill around it without delaying it; an inference service scaled 2 → 4 → 1 gains and loses allocations."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from dashboard_fleet import start_second_cluster, stop
from support import AllocationWatcher, complete, eventually_async, finish_all, wait_state

from libs.contracts.events import AllocationGranted, AllocationReleased

pytestmark = pytest.mark.e2e
FLEET_NODES = 3
UP_ARGS = ["--fleet", "H100-80GB*8;H100-80GB*8;H100-80GB*8", "--env", "placement:MIN_RUNTIME_S=0"]


def post_job(api, **body) -> str:  # type: ignore[no-untyped-def]
    response = api.post("/v1/jobs", json={"team": "research", **body})
    assert response.status_code == 201, response.text
    return response.json()["job_id"]


def reason(api, job_id: str) -> str:  # type: ignore[no-untyped-def]
    return api.get(f"/v1/jobs/{job_id}/explain").json()["placement"].get("reason")



async def test_a_gang_is_placed_all_or_nothing_while_short_jobs_backfill_without_delaying_it(platform) -> None:  # type: ignore[no-untyped-def]
    async with AllocationWatcher(platform.nats_url) as watcher:
        with platform.client() as api:
            finish_all(api)
            short_holder = post_job(api, name="x", gpus=8, max_runtime_s=60)
            long_holder = post_job(api, name="y", gpus=8, max_runtime_s=600)
            for job_id in (short_holder, long_holder):
                await watcher.wait_for(AllocationGranted, job_id)

            gang = post_job(api, name="gang", kind="training", gpus=16, gang_nodes=2, gpus_per_node=8)
            await eventually_async(lambda: reason(api, gang) == "WaitingForGang", "the gang to wait for its nodes", timeout=10)
            backfill = post_job(api, name="short", gpus=2, max_runtime_s=30)
            _, _, small = await watcher.wait_for(AllocationGranted, backfill)
            blocker = post_job(api, name="unbounded", gpus=2)
            await eventually_async(lambda: reason(api, blocker) == "ReservedForGang", "the blocker to be held back for the gang", timeout=10)
            assert watcher.of(AllocationGranted, gang) == [], "no member of the gang may start alone"
            assert watcher.of(AllocationGranted, blocker) == []

            complete(api, backfill)
            complete(api, short_holder)
            await watcher.wait_for(AllocationGranted, gang)
            await asyncio.sleep(1.0)
            members = [d for _, _, d in watcher.of(AllocationGranted, gang)]
            assert sorted(m.replica for m in members) == [0, 1]
            assert len({m.node for m in members}) == 2 and all(len(m.gpus) == 8 for m in members)
            assert len({m.granted_at for m in members}) == 1, "both members were committed together"
            assert small.node in {m.node for m in members}, "the backfilled job ran where the gang was to start"
            assert watcher.of(AllocationGranted, blocker) == []
            assert api.get(f"/v1/jobs/{gang}").json()["state"] == "running"

            api.post(f"/v1/jobs/{gang}/complete")
            _, _, released = await watcher.wait_for(AllocationReleased, gang)
            await eventually_async(lambda: len(watcher.of(AllocationReleased, gang)) == 2, "both gang allocations released", timeout=10)
            finish_all(api)


async def test_an_inference_service_scaled_from_2_to_4_gets_2_more_allocations_and_back_to_1(platform) -> None:  # type: ignore[no-untyped-def]
    async with AllocationWatcher(platform.nats_url) as watcher:
        with platform.client() as api:
            finish_all(api)
            service = post_job(api, name="chat", kind="inference", gpus=1, replicas=2,
                               priority_class="production-inference")
            await eventually_async(lambda: len(watcher.of(AllocationGranted, service)) == 2, "2 replicas granted", timeout=10)
            scaled = api.patch(f"/v1/jobs/{service}", json={"replicas": 4})
            assert scaled.status_code == 200 and scaled.json()["replicas"] == 4
            await eventually_async(lambda: len(watcher.of(AllocationGranted, service)) == 4, "4 replicas granted", timeout=10)
            replicas = sorted(d.replica for _, _, d in watcher.of(AllocationGranted, service))
            assert replicas == [0, 1, 2, 3]
            live = api.get("/v1/allocations", params={"job_id": service, "active": "true"}).json()["items"]
            assert len(live) == 4

            api.patch(f"/v1/jobs/{service}", json={"replicas": 1})
            await eventually_async(lambda: len(watcher.of(AllocationReleased, service)) == 3, "3 replica releases", timeout=10)
            gone = sorted((d.replica, d.reason) for _, _, d in watcher.of(AllocationReleased, service))
            assert gone == [(1, "ScaledDown"), (2, "ScaledDown"), (3, "ScaledDown")]
            explained = api.get(f"/v1/jobs/{service}/explain").json()["placement"]
            assert explained["replicas_running"] == 1 and explained["replicas_wanted"] == 1
            assert api.get(f"/v1/jobs/{service}").json()["state"] == "running"

            gang = post_job(api, name="not-scalable", gpus=16, gang_nodes=2, gpus_per_node=8)
            refused = api.patch(f"/v1/jobs/{gang}", json={"replicas": 2})
            assert refused.status_code == 409 and refused.json()["reason"] == "NotScalable"
            finish_all(api)


async def test_a_job_bigger_than_the_pool_is_unschedulable_blocks_nobody_and_runs_once_the_pool_grows(platform) -> None:  # type: ignore[no-untyped-def]
    with platform.client() as api:
        finish_all(api)
        huge = post_job(api, name="huge", kind="training", gpus=12)  # on one node: the nodes have 8
        wide = post_job(api, name="wide", kind="training", gpus=32, gang_nodes=4, gpus_per_node=8)  # 3 nodes
        await eventually_async(lambda: reason(api, huge) == "Unschedulable" and reason(api, wide) == "Unschedulable",
                               "both unschedulable", timeout=10)
        explained = api.get(f"/v1/jobs/{huge}/explain").json()["placement"]
        assert "could hold 12 whole GPU(s)" in explained["message"] and "even empty" in explained["message"], explained
        assert "only 3 node(s)" in api.get(f"/v1/jobs/{wide}/explain").json()["placement"]["message"]
        fits = post_job(api, name="fits", gpus=8)  # submitted after them, placed regardless
        await eventually_async(lambda: api.get(f"/v1/jobs/{fits}").json()["state"] == "running", "placed", timeout=10)
        for job_id in (huge, wide):
            assert api.get(f"/v1/jobs/{job_id}").json()["state"] == "pending"
        complete(api, fits)

        # the pool grows: a fourth 8-GPU node joins the cluster, and the 4-node gang runs on it and the others
        late = start_second_cluster(platform, cluster="local", fleet="H100-80GB*8", prefix="late-node")
        try:
            await eventually_async(lambda: api.get(f"/v1/jobs/{wide}").json()["state"] == "running",
                                   "the gang to run once a fourth node joined", timeout=90)
            assert reason(api, huge) == "Unschedulable"  # still no node with 12 GPUs
        finally:
            for job_id in (huge, wide):
                api.post(f"/v1/jobs/{job_id}/cancel")
            stop(late)
        finish_all(api)


def test_inconsistent_gang_shapes_are_refused_at_the_edge(platform) -> None:  # type: ignore[no-untyped-def]
    with platform.client() as api:
        bad = api.post("/v1/jobs", json={"name": "bad", "team": "research", "gpus": 10, "gang_nodes": 2,
                                         "gpus_per_node": 8})
        assert bad.status_code == 422 and bad.json()["reason"] == "InvalidRequest"


async def test_a_job_that_needs_approval_runs_only_after_a_team_admin_approves_it(platform) -> None:  # type: ignore[no-untyped-def]
    async with AllocationWatcher(platform.nats_url) as watcher:
        with platform.client() as api:
            finish_all(api)
            assert api.put("/v1/approval-rules/gpus_over", json={"value": "4"}).status_code == 200
            try:
                team_admin = api.post("/v1/tokens", json={"name": "lead", "role": "team-admin",
                                                          "team": "research"}).json()["token"]
                member = api.post("/v1/tokens", json={"name": "dev", "role": "member",
                                                      "team": "research"}).json()["token"]
                response = api.post("/v1/jobs", json={"name": "big", "team": "research", "gpus": 6})
                assert response.status_code == 201, response.text
                job = response.json()
                assert job["state"] == "awaiting_approval" and job["approval_reasons"] == ["more than 4 GPUs"]
                small = post_job(api, name="small", gpus=2)  # under the rule: straight to the queue
                await watcher.wait_for(AllocationGranted, small)
                await asyncio.sleep(1.5)
                assert watcher.of(AllocationGranted, job["job_id"]) == []
                listed = api.get("/v1/approvals", params={"state": "pending"}).json()["items"]
                assert [a["job_id"] for a in listed if a["approval_id"] == job["approval_id"]] == [job["job_id"]]

                url = f"{platform.gateway}/v1/approvals/{job['approval_id']}/approve"
                refused = httpx.post(url, headers={"Authorization": f"Bearer {member}"})
                assert refused.status_code == 403
                approved = httpx.post(url, json={"comment": "go"}, headers={"Authorization": f"Bearer {team_admin}"})
                assert approved.status_code == 200 and approved.json()["state"] == "approved"
                again = httpx.post(url, headers={"Authorization": f"Bearer {team_admin}"})
                assert again.status_code == 409 and again.json()["reason"] == "AlreadyDecided"
                await watcher.wait_for(AllocationGranted, job["job_id"])
                wait_state(api, job["job_id"], "running")  # the queue learns of the grant from the event
                history = [h["to"] for h in api.get(f"/v1/jobs/{job['job_id']}").json()["history"]]
                assert history[:3] == ["awaiting_approval", "pending", "running"]

                denied_job = api.post("/v1/jobs", json={"name": "bigger", "team": "research", "gpus": 8}).json()
                api.post(f"/v1/approvals/{denied_job['approval_id']}/deny", json={"comment": "not now"})
                deadline = asyncio.get_running_loop().time() + 10
                while api.get(f"/v1/jobs/{denied_job['job_id']}").json()["state"] != "failed":
                    assert asyncio.get_running_loop().time() < deadline
                    await asyncio.sleep(0.05)
                assert "not now" in api.get(f"/v1/jobs/{denied_job['job_id']}").json()["message"]
                assert watcher.of(AllocationGranted, denied_job["job_id"]) == []
            finally:
                api.put("/v1/approval-rules/gpus_over", json={"value": "4", "enabled": False})
                finish_all(api)


class EventLog:
    """Every event on the given subjects, decoded, as another system subscribed to them would see it."""

    def __init__(self, url: str, *subjects: str) -> None:
        self.url, self.subjects, self.events = url, subjects, []

    async def __aenter__(self) -> EventLog:
        import nats

        from libs.contracts.envelope import parse_envelope
        from libs.contracts.events import decode_data

        self.nc = await nats.connect(self.url)

        async def on_msg(msg) -> None:  # type: ignore[no-untyped-def]
            self.events.append(decode_data(parse_envelope(msg.data)))

        for subject in self.subjects:
            await self.nc.subscribe(subject, cb=on_msg)
        await self.nc.flush()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.nc.close()

    def of(self, kind: type, **match) -> list:  # type: ignore[no-untyped-def]
        return [e for e in self.events if isinstance(e, kind) and all(getattr(e, k) == v for k, v in match.items())]


async def test_approval_requests_are_announced_explained_and_withdrawn_when_their_job_is_cancelled(platform) -> None:  # type: ignore[no-untyped-def]
    from libs.contracts.events import ApprovalRequested, ApprovalWithdrawn, JobStateChanged

    async with EventLog(platform.nats_url, "gpupool.quota.>", "gpupool.job.state_changed") as log:
        with platform.client() as api:
            finish_all(api)
            assert api.put("/v1/approval-rules/gpus_over", json={"value": "4"}).status_code == 200
            try:
                jobs = [api.post("/v1/jobs", json={"name": f"held-{i}", "team": "research", "gpus": 5}).json()
                        for i in range(3)]
                assert all(j["state"] == "awaiting_approval" for j in jobs)
                held = jobs[0]
                explained = api.get(f"/v1/jobs/{held['job_id']}/explain").json()
                assert explained["placement"]["reason"] == "AwaitingApproval"
                assert "more than 4 GPUs" in explained["placement"]["message"]
                assert explained["approval"]["approval_id"] == held["approval_id"]
                await eventually_async(lambda: len(log.of(ApprovalRequested, job_id=held["job_id"])) == 1, "the approval request event", timeout=10)
                assert log.of(ApprovalRequested, job_id=held["job_id"])[0].reasons == ["more than 4 GPUs"]

                # cursor pagination over the approvals, newest first
                first = api.get("/v1/approvals", params={"state": "pending", "limit": 2}).json()
                rest = api.get("/v1/approvals", params={"state": "pending", "limit": 2,
                                                        "cursor": first["next"]}).json()
                ids = [a["approval_id"] for a in first["items"] + rest["items"]]
                assert ids == sorted(ids, reverse=True) and {j["approval_id"] for j in jobs} <= set(ids)

                assert api.post(f"/v1/jobs/{held['job_id']}/cancel").status_code == 200
                await eventually_async(lambda: len(log.of(ApprovalWithdrawn, job_id=held["job_id"])) == 1, "the approval withdrawn event", timeout=10)
                [request] = api.get("/v1/approvals", params={"job_id": held["job_id"]}).json()["items"]
                assert request["state"] == "withdrawn"
                late = api.post(f"/v1/approvals/{held['approval_id']}/approve")
                assert late.status_code == 409 and late.json()["reason"] == "AlreadyDecided"

                # every transition of the job's state machine was an event, in order
                await eventually_async(lambda: len(log.of(JobStateChanged, job_id=held["job_id"])) == 2, "two state changes of the held job", timeout=10)
                moves = [(e.previous, e.current, e.reason) for e in log.of(JobStateChanged, job_id=held["job_id"])]
                assert moves == [(None, "awaiting_approval", "AwaitingApproval"),
                                 ("awaiting_approval", "cancelled", "CancelledByUser")]
            finally:
                api.put("/v1/approval-rules/gpus_over", json={"value": "4", "enabled": False})
                finish_all(api)
            ran = post_job(api, name="runs", gpus=1)
            await eventually_async(lambda: [e.current for e in log.of(JobStateChanged, job_id=ran)] == ["pending", "running"], "pending → running", timeout=10)
            api.post(f"/v1/jobs/{ran}/complete")
            await eventually_async(lambda: [e.current for e in log.of(JobStateChanged, job_id=ran)][-1] == "completed", "the job completed", timeout=10)
