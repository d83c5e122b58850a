"""Placement's scheduling cycle on a real PostgreSQL: a cycle writes all its units in one transaction, yet a unit
the store refuses (a stale plan) is left out alone; a job whose row another transaction holds waits for the next
cycle; what a cycle decided is recorded and replays to the same plan; an event applied inside a consumer's batch
transaction wakes the cycle only once the batch committed."""

from __future__ import annotations

import asyncio
import base64
import gzip
import hashlib
import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from types import SimpleNamespace

import pytest
from nats.js import JetStreamContext
from prometheus_client import REGISTRY

from libs.cli.decisions import replay
from libs.contracts.commands import GetDecision
from libs.contracts.envelope import uuid7
from libs.contracts.events import AllocatedGpu, GpuSpec, JobCompleted, JobSubmitted, NodeRegistered
from libs.runtime.service import ServiceRuntime
from services.placement import store
from services.placement.config import PlacementSettings
from services.placement.handlers import PlacementHandlers

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("keep_test_logging_and_tracing")]
NOW = datetime(2026, 11, 30, tzinfo=UTC)


@pytest.fixture
async def placement(nats_url: str, fresh_database_dsn: str,
                    js: JetStreamContext) -> AsyncIterator[tuple[ServiceRuntime, PlacementHandlers]]:
    settings = PlacementSettings(nats_url=nats_url, database_url=fresh_database_dsn, http_port=0, log_level="WARNING",
                                 instance="pl-cycle-test", cycle_interval_s=3600)
    rt = ServiceRuntime("placement", settings, migrations_package="services.placement")
    await rt.start()  # no routes mounted and no loop started: the test drives the cycles itself
    try:
        assert rt.pool is not None
        async with rt.pool.acquire() as conn:
            await store.upsert_node(conn, NodeRegistered(
                cluster="c", node="n1", hostname="n1", cpu_count=64, memory_mib=512_000, registered_at=NOW,
                gpus=[GpuSpec(uuid=f"G{i}", index=i, model="H100", memory_mib=81_920) for i in range(3)]))
        yield rt, PlacementHandlers(rt, settings)
    finally:
        await rt.shutdown()


def job(job_id: str, gpus: int = 1) -> JobSubmitted:
    return JobSubmitted(job_id=job_id, name=job_id, team="ml", project="default", kind="batch",
                        priority_class="normal", priority=0, gpus=gpus, submitted_at=NOW)


async def want(rt: ServiceRuntime, *jobs: JobSubmitted) -> None:
    assert rt.pool is not None
    async with rt.pool.acquire() as conn:
        for j in jobs:
            assert await store.add_pending(conn, j, None)


async def holdings(rt: ServiceRuntime) -> dict[str, list[str]]:
    assert rt.pool is not None
    rows = await rt.pool.fetch("""SELECT a.job_id, g.gpu_uuid FROM allocations a JOIN allocation_gpus g
                                  USING (allocation_id) WHERE a.released_at IS NULL ORDER BY g.gpu_uuid""")
    out: dict[str, list[str]] = {}
    for r in rows:
        out.setdefault(r["job_id"], []).append(r["gpu_uuid"])
    return out


async def granted_jobs(rt: ServiceRuntime) -> list[str]:
    assert rt.pool is not None
    rows = await rt.pool.fetch("SELECT payload FROM outbox WHERE subject = 'gpupool.allocation.granted'")
    return sorted(json.loads(r["payload"])["data"]["job_id"] for r in rows)


async def test_a_cycle_places_many_units_together_and_records_one_replayable_decision(placement) -> None:  # type: ignore[no-untyped-def]
    rt, h = placement
    await want(rt, job("a"), job("b"), job("c"))
    stored_before = REGISTRY.get_sample_value("gpupool_scheduling_cycle_part_seconds_count", {"part": "store"}) or 0
    assert await h.run_cycle() == 3
    # /metrics splits the cycle into its parts (the backlog benchmark reports them)
    assert REGISTRY.get_sample_value("gpupool_scheduling_cycle_part_seconds_count", {"part": "store"}) == \
        stored_before + 1
    assert set(h.phases) == {"load_s", "build_s", "core_s", "store_s"}
    held = await holdings(rt)
    assert sorted(held) == ["a", "b", "c"] and sorted(sum(held.values(), [])) == ["G0", "G1", "G2"]
    assert await granted_jobs(rt) == ["a", "b", "c"]
    assert rt.pool is not None
    assert await rt.pool.fetchval("SELECT count(*) FROM pending_jobs WHERE NOT satisfied") == 0
    [row] = await rt.pool.fetch("SELECT cycle_id, summary FROM decisions")
    summary = json.loads(row["summary"])
    assert sorted(p["unit"] for p in summary["placements"] if p["applied"]) == ["a", "b", "c"]
    reply = await h.get_decision(GetDecision(cycle_id=row["cycle_id"]))
    result = replay(SimpleNamespace(**reply.result))
    assert result["same"] and result["placements"] == 3, result
    # the recorded input is what the digest says
    digest = await rt.pool.fetchval("SELECT input_digest FROM decisions")
    assert hashlib.sha256(gzip.decompress(base64.b64decode(reply.result["input_gzip_base64"]))).hexdigest() == digest



async def test_turnovers_are_recorded_as_deltas_that_replay_and_the_prune_keeps_their_keyframe(  # type: ignore[no-untyped-def]
        placement, monkeypatch) -> None:
    rt, h = placement
    monkeypatch.setattr("services.placement.handlers.PRUNE_EVERY", 1)
    h.settings.decision_retention = 2
    await want(rt, *(job(f"j{k}") for k in range(8)))
    assert await h.run_cycle() == 3  # the keyframe: 3 placed, 5 wait
    assert rt.pool is not None
    written = await rt.pool.fetchval("SELECT decided_at FROM queue_order")
    for k in range(3):  # a job completes, the next one gets its GPU: each cycle a delta on the keyframe
        async with rt.uow() as uow:
            await h._release(uow, f"j{k}", "JobCompleted", NOW, finished=True)
        assert await h.run_cycle() == 1
    # the jobs that got GPUs only left the queue's order: it is not written again, and positions still hold
    assert await rt.pool.fetchval("SELECT decided_at FROM queue_order") == written
    async with rt.pool.acquire() as conn:
        assert [(await store.explain(conn, j))["position"] for j in ("j6", "j7")] == [1, 2]
    rows = await rt.pool.fetch("SELECT cycle_id, base_id, input_digest FROM decisions ORDER BY cycle_id")
    # the newest two are kept, and the keyframe both stand on although it is older
    assert len(rows) == 3 and rows[0]["base_id"] is None
    assert [r["base_id"] for r in rows[1:]] == [rows[0]["cycle_id"]] * 2
    for r in rows:
        reply = await h.get_decision(GetDecision(cycle_id=r["cycle_id"]))
        assert hashlib.sha256(gzip.decompress(base64.b64decode(reply.result["input_gzip_base64"]))).hexdigest() \
            == r["input_digest"]
        result = replay(SimpleNamespace(**reply.result))
        assert result["same"], result
    # a failed cycle forgets the keyframe: the next record is a keyframe of its own
    h._recorder.forget()
    async with rt.uow() as uow:
        await h._release(uow, "j3", "JobCompleted", NOW, finished=True)
    assert await h.run_cycle() == 1
    newest = await rt.pool.fetchrow("SELECT base_id FROM decisions ORDER BY cycle_id DESC LIMIT 1")
    assert newest["base_id"] is None


async def test_a_unit_the_store_refuses_is_left_out_and_the_others_of_its_cycle_commit(placement, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    rt, h = placement
    await want(rt, job("a"), job("b"), job("c"))
    real_plan = h._scheduler.plan
    stolen: list[str] = []

    def schedule_then_lose_a_gpu(snapshot, pending, policy, now, clock=None, memo=None):  # type: ignore[no-untyped-def]
        plan = real_plan(snapshot, pending, policy, now, clock, memo)
        stolen.append(next(p for p in plan.placements if p.job_id == "b").gpu_uuids[0])
        return plan

    monkeypatch.setattr(h._scheduler, "plan", schedule_then_lose_a_gpu)
    # another writer (a deposed leader, say) takes the GPU the plan gives "b" after the snapshot was read
    real_apply = h._apply_units

    async def apply_after_a_rival(uow, units, models, traces, rendezvous):  # type: ignore[no-untyped-def]
        assert rt.pool is not None
        async with rt.pool.acquire() as conn, conn.transaction():
            await conn.execute("""INSERT INTO pending_jobs (job_id, team, project, gpus, priority, submitted_at)
                                  VALUES ('rival', 'ml', 'default', 1, 0, now())""")
            await store.insert_allocation(conn, uuid7(), {"job_id": "rival", "team": "ml", "project": "default",
                                                          "priority": 0, "priority_class": "", "kind": "batch",
                                                          "max_runtime_s": None},
                                          0, "c", "n1", [await gpu_of(conn, stolen[0])], NOW, {})
        return await real_apply(uow, units, models, traces, rendezvous)

    monkeypatch.setattr(h, "_apply_units", apply_after_a_rival)
    assert await h.run_cycle() == 2
    held = await holdings(rt)
    assert sorted(held) == ["a", "c", "rival"]
    assert held["rival"] == stolen
    assert await granted_jobs(rt) == ["a", "c"]  # no event for the refused unit
    assert rt.pool is not None
    assert await rt.pool.fetchval("SELECT satisfied FROM pending_jobs WHERE job_id = 'b'") is False
    summary = json.loads(await rt.pool.fetchval("SELECT summary FROM decisions"))
    assert {p["unit"]: p["applied"] for p in summary["placements"]} == {"a": True, "b": False, "c": True}
    # the scheduler kept for the next cycle forgets the refused unit and learns the rival's GPU from the store:
    # once "a" completes, "b" gets a's GPU, on the kept scheduler
    monkeypatch.setattr(h._scheduler, "plan", real_plan)
    monkeypatch.setattr(h, "_apply_units", real_apply)
    freed = held["a"]
    async with rt.uow() as uow:
        await h._release(uow, "a", "JobCompleted", NOW, finished=True)
    assert await h.run_cycle() == 1 and h._scheduler.rebuilt == ""
    assert (await holdings(rt))["b"] == freed


async def gpu_of(conn, uuid: str) -> AllocatedGpu:  # type: ignore[no-untyped-def]
    row = await conn.fetchrow("SELECT idx, model FROM gpus WHERE uuid = $1", uuid)
    return AllocatedGpu(uuid=uuid, index=row["idx"], model=row["model"])


async def test_a_job_whose_row_is_held_by_another_transaction_waits_for_the_next_cycle(placement) -> None:  # type: ignore[no-untyped-def]
    rt, h = placement
    await want(rt, job("a"), job("b"))
    assert rt.pool is not None
    async with rt.pool.acquire() as conn:
        tx = conn.transaction()
        await tx.start()
        await conn.execute("SELECT 1 FROM pending_jobs WHERE job_id = 'b' FOR UPDATE")  # an event being applied
        placed = await asyncio.wait_for(h.run_cycle(), timeout=10)  # not blocked by it
        await tx.rollback()
    assert placed == 1 and sorted(await holdings(rt)) == ["a"]
    assert await h.run_cycle() == 1
    assert sorted(await holdings(rt)) == ["a", "b"]


async def test_an_event_applied_in_a_consumer_batch_wakes_the_cycle_only_after_the_batch_commits(placement) -> None:  # type: ignore[no-untyped-def]
    rt, h = placement
    event = job("late").to_cloudevent("/gpupool/queue")
    async with rt.batch_transaction():
        await h.on_job_submitted(event, job("late"))
        assert not h._kick.is_set()  # a cycle now would not see the job yet
    assert h._kick.is_set()
    assert await h.run_cycle() == 1


async def test_a_completed_job_releases_its_gpus_and_a_late_submission_never_brings_it_back(placement) -> None:  # type: ignore[no-untyped-def]
    rt, h = placement
    await want(rt, job("done", gpus=2))
    assert await h.run_cycle() == 1
    held = (await holdings(rt))["done"]
    await h.on_job_completed(JobCompleted(job_id="done", team="ml", completed_at=NOW).to_cloudevent("/gpupool/queue"),
                             JobCompleted(job_id="done", team="ml", completed_at=NOW))
    assert await holdings(rt) == {}
    assert rt.pool is not None
    released = [json.loads(r["payload"])["data"] for r in await rt.pool.fetch(
        "SELECT payload FROM outbox WHERE subject = 'gpupool.allocation.released'")]
    assert [(r["job_id"], r["reason"], sorted(g["uuid"] for g in r["gpus"])) for r in released] == [
        ("done", "JobCompleted", held)]
    assert len(held) == 2
    assert await rt.pool.fetchval("SELECT count(*) FROM pending_jobs") == 0
    late = job("done", gpus=2)
    await h.on_job_submitted(late.to_cloudevent("/gpupool/queue"), late)
    assert await rt.pool.fetchval("SELECT count(*) FROM pending_jobs") == 0
    assert await h.run_cycle() == 0
