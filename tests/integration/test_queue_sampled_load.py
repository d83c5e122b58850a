"""The queue keeps what the agents sample from each replica, on a real PostgreSQL: the latest sample per replica
for a job that autoscales on that signal (a late or replayed one never replaces a newer one; another signal's is
ignored), scale-ups counted over the replicas the job has, a pushed load refused for such a job, and every sample
forgotten once the job ends."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import timedelta

import pytest

from libs.contracts.autoscale import AutoscalePolicy
from libs.contracts.commands import ReportLoad
from libs.contracts.envelope import utcnow
from libs.contracts.events import WorkLoadSampled
from libs.contracts.work import WorkSpec
from libs.runtime.service import ServiceRuntime
from services.queue import store
from services.queue.config import QueueSettings
from services.queue.handlers import QueueHandlers

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("keep_test_logging_and_tracing")]
POLICY = AutoscalePolicy(signal="gpu_utilization", target=50, sample_every_s=1, sample_ttl_s=30,
                         scale_up_stabilization_s=0, cooldown_s=0)


@pytest.fixture
async def queue(nats_url: str, fresh_database_dsn: str) -> AsyncIterator[tuple[ServiceRuntime, QueueHandlers]]:
    settings = QueueSettings(nats_url=nats_url, database_url=fresh_database_dsn, http_port=0, log_level="WARNING",
                             instance="queue-load-test", autoscale_interval_s=3600)
    rt = ServiceRuntime("queue", settings, migrations_package="services.queue")
    await rt.start()
    try:
        assert rt.pool is not None
        async with rt.pool.acquire() as conn:
            await store.insert_job(conn, {
                "job_id": "svc-1", "name": "svc", "team": "t", "project": "default", "kind": "inference",
                "priority_class": "normal", "priority": 0, "gpus": 1, "gpu_models": [], "submitted_by": "x",
                "submitted_at": utcnow(), "idempotency_key": None, "request_hash": None, "gang_nodes": 0,
                "gpus_per_node": 0, "replicas": 2, "max_runtime_s": None, "state": "running",
                "gpu_fraction_milli": 0, "gpu_memory_mib": 0, "mig_profile": "", "exclusive": False,
                "work": WorkSpec(command=["server"]), "min_replicas": 2, "max_replicas": 4, "autoscale": POLICY})
        yield rt, QueueHandlers(rt, settings)
    finally:
        await rt.shutdown()


def sampled(replica: int, value: float, *, ago_s: float = 0.0, signal: str = "gpu_utilization") -> tuple:
    data = WorkLoadSampled(allocation_id=f"a-{replica}", job_id="svc-1", team="t", project="default", cluster="c",
                           node="n", replica=replica, signal=signal, value=value,  # type: ignore[arg-type]
                           sampled_at=utcnow() - timedelta(seconds=ago_s))
    return data.to_cloudevent("agent/c/n"), data


async def kept(rt: ServiceRuntime) -> dict[str, float]:
    assert rt.pool is not None
    rows = await rt.pool.fetch("SELECT reporter, value FROM autoscale_load WHERE job_id = 'svc-1'")
    return {r["reporter"]: r["value"] for r in rows}


async def test_the_latest_sample_of_each_replica_is_kept_and_scales_the_service(queue) -> None:  # type: ignore[no-untyped-def]
    rt, h = queue
    await h.autoscaler.on_work_load(*sampled(0, 90))
    await h.autoscaler.on_work_load(*sampled(1, 80))
    await h.autoscaler.on_work_load(*sampled(1, 10, ago_s=5))  # late: older than what is kept
    await h.autoscaler.on_work_load(*sampled(0, 99, signal="metric"))  # not this job's signal
    await h.autoscaler.on_work_load(*sampled(3, 100))  # a replica beyond the job's 2 (scaled away): not counted
    assert await kept(rt) == {"agent-replica-0": 90, "agent-replica-1": 80, "agent-replica-3": 100}
    assert await h.autoscaler.evaluate("svc-1") == 1
    job = await store.get_job(rt.pool, "svc-1")
    assert job is not None and job["replicas"] == 4  # (90 + 80) / 50 → 4; replica 3's 100 would have made it 6
    refused = await h.autoscaler.report_load(ReportLoad(job_id="svc-1", value=5))
    assert refused.error is not None and refused.error.reason == "LoadNotPushed", refused


async def test_a_finished_job_forgets_its_samples(queue) -> None:  # type: ignore[no-untyped-def]
    rt, h = queue
    await h.autoscaler.on_work_load(*sampled(0, 90))
    assert await kept(rt)
    async with rt.uow() as uow:
        row = await store.get_job(uow.conn, "svc-1", for_update=True)
        await h._set_state(uow, row, "cancelled", "Cancelled", at=utcnow())
    assert await kept(rt) == {}
    await h.autoscaler.on_work_load(*sampled(0, 90))  # a sample still on its way: not kept for an ended job
    assert await kept(rt) == {}
