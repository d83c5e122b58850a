"""Admission back-pressure's counts on a real PostgreSQL: the jobs waiting for placement (bounded by the cap) and
the jobs any replica granted within the window, read from the jobs' last start (migration 0013's index)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import timedelta

import pytest

from libs.contracts.envelope import utcnow
from libs.contracts.work import WorkSpec
from libs.runtime.service import ServiceRuntime
from services.queue import store
from services.queue.config import QueueSettings

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("keep_test_logging_and_tracing")]


@pytest.fixture
async def queue_db(nats_url: str, fresh_database_dsn: str) -> AsyncIterator[ServiceRuntime]:
    settings = QueueSettings(nats_url=nats_url, database_url=fresh_database_dsn, http_port=0, log_level="WARNING",
                             instance="queue-backlog-test", autoscale_interval_s=3600)
    rt = ServiceRuntime("queue", settings, migrations_package="services.queue")
    await rt.start()
    try:
        yield rt
    finally:
        await rt.shutdown()


def job(job_id: str, state: str) -> dict:
    return {"job_id": job_id, "name": job_id, "team": "t", "project": "default", "kind": "batch",
            "priority_class": "normal", "priority": 0, "gpus": 1, "gpu_models": [], "submitted_by": "x",
            "submitted_at": utcnow(), "idempotency_key": None, "request_hash": None, "gang_nodes": 0,
            "gpus_per_node": 0, "replicas": 1, "max_runtime_s": None, "state": state, "gpu_fraction_milli": 0,
            "gpu_memory_mib": 0, "mig_profile": "", "exclusive": False, "work": WorkSpec(command=["true"]),
            "min_replicas": None, "max_replicas": None, "autoscale": None}


async def test_the_backlog_counts_waiting_jobs_up_to_the_cap_and_grants_within_the_window(
        queue_db: ServiceRuntime) -> None:
    assert queue_db.pool is not None
    async with queue_db.pool.acquire() as conn:
        assert await store.backlog_counts(conn, 10, 60.0) == (0, 0)
        for i in range(4):
            await store.insert_job(conn, job(f"wait-{i}", "pending"))
        started = {"now-1": timedelta(seconds=5), "now-2": timedelta(seconds=30), "old": timedelta(seconds=600)}
        for job_id, ago in started.items():
            await store.insert_job(conn, job(job_id, "running"))
            await conn.execute("UPDATE jobs SET started_at = $2 WHERE job_id = $1", job_id, utcnow() - ago)
        assert await store.backlog_counts(conn, 10, 60.0) == (4, 2)  # granted 5 s and 30 s ago, not 600 s ago
        assert await store.backlog_counts(conn, 3, 10.0) == (3, 1)  # the waiting counted up to the cap only
        assert await store.backlog_counts(conn, 10, 3600.0) == (4, 3)
