"""libs/runtime wiring against real NATS and PostgreSQL: a service's database is created and migrated at start,
its routes are served and consumed, the ops endpoint answers, and SIGTERM drains gracefully."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest
from nats.js import JetStreamContext
from prometheus_client import REGISTRY
from waiting import eventually

from libs.bus.rpc import request
from libs.contracts import subjects
from libs.contracts.commands import Command, Empty, Reply
from libs.contracts.envelope import CloudEvent
from libs.contracts.events import JobStarted, JobSubmitted
from libs.contracts.subjects import EVENTS_STREAM
from libs.runtime.routes import Routes, idempotent
from libs.runtime.service import ServiceRuntime
from libs.runtime.settings import ServiceSettings

# a stand-in for the queue service: what it emits and consumes are the queue's events, which only /gpupool/queue
# may send (libs/contracts/origins.py)
NAME = "queue"
RECORDS_ONLY = "a test handler: it only records what it saw"

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("keep_test_logging_and_tracing")]


class Greet(Command):
    who: str


@pytest.fixture
def migrations_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """An importable package with one service migration, like services/<name>/migrations."""
    package = f"rt_pkg_{uuid.uuid4().hex[:8]}"
    root = tmp_path / "src" / package
    (root / "migrations").mkdir(parents=True)
    (root / "__init__.py").write_text("")
    (root / "migrations" / "0001_jobs.sql").write_text("CREATE TABLE jobs (job_id TEXT PRIMARY KEY);")
    monkeypatch.syspath_prepend(str(tmp_path / "src"))
    yield package
    sys.modules.pop(package, None)


def runtime(nats_url: str, dsn: str, package: str) -> ServiceRuntime:
    settings = ServiceSettings(nats_url=nats_url, database_url=dsn, http_port=0, log_level="WARNING",
                               instance="rt-test-1")
    return ServiceRuntime(NAME, settings, migrations_package=package)


def job(job_id: str) -> JobSubmitted:
    return JobSubmitted(job_id=job_id, name="train", team="ml", project="default", kind="training",
                        priority_class="normal", priority=500, gpus=1, submitted_at=datetime.now(UTC))


async def test_runtime_creates_and_migrates_its_database_and_answers_on_the_bus_and_http(
        nats_url: str, fresh_database_dsn: str, migrations_package: str, js: JetStreamContext) -> None:
    rt = runtime(nats_url, fresh_database_dsn, migrations_package)
    await rt.start()
    try:
        assert rt.pool is not None
        rows = await rt.pool.fetch("SELECT namespace, version FROM schema_migrations ORDER BY namespace")
        assert [(r["namespace"], r["version"]) for r in rows] == [(NAME, 1), ("store", 1), ("store", 2)]
        assert {s.config.name for s in await js.streams_info()} == {s.name for s in subjects.STREAMS}

        ping = await request(rt.nc, subjects.health_ping(NAME), Empty(), timeout=2)
        assert ping == Reply.success({"service": NAME, "instance": "rt-test-1"})

        assert rt.http is not None
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{rt.http.port}", timeout=5) as http:
            assert (await http.get("/healthz")).status_code == 200
            ready = await http.get("/readyz")
            assert ready.status_code == 200 and ready.json() == {"status": "ready"}
            metrics = await http.get("/metrics")
            assert metrics.status_code == 200 and "gpupool_rpc_requests_total" in metrics.text
            assert (await http.get("/nope")).status_code == 404
            assert rt.relay is not None
            await rt.relay.stop()
            rt.relay = None
            await rt.pool.close()  # the database is gone: not ready any more
            assert (await http.get("/readyz")).status_code == 503
            rt.pool = None
    finally:
        await rt.shutdown()
    assert rt.nc.is_closed


async def test_mounted_routes_serve_commands_and_consume_events_through_the_outbox(
        nats_url: str, fresh_database_dsn: str, migrations_package: str, js: JetStreamContext) -> None:
    rt = runtime(nats_url, fresh_database_dsn, migrations_package)
    consumed: list[CloudEvent] = []

    async def greet(cmd: Greet) -> dict[str, str]:
        async with rt.uow() as uow:
            await uow.conn.execute("INSERT INTO jobs (job_id) VALUES ($1)", cmd.who)
            await uow.emit(job(cmd.who))
        return {"hello": cmd.who}

    async def on_submitted(event: CloudEvent, data: JobSubmitted) -> None:
        consumed.append(event)

    routes = Routes(commands={"gpupool.cmd.queue.greet": (Greet, greet)},
                    events={JobSubmitted: idempotent(on_submitted, RECORDS_ONLY)})
    await rt.start()
    try:
        await rt.mount(routes)
        reply = await request(rt.nc, "gpupool.cmd.queue.greet", Greet(who="j-42"), timeout=3)
        assert reply == Reply.success({"hello": "j-42"})
        served = {o: REGISTRY.get_sample_value("gpupool_rpc_requests_total",
                                               {"subject": "gpupool.cmd.queue.greet", "outcome": o})
                  for o in ("ok", "refused", "invalid", "error")}
        assert served == {"ok": 1.0, "refused": 0.0, "invalid": 0.0, "error": 0.0}  # 0, not absent
        # outbox → relay (woken by the commit) → stream → the service's own durable consumer
        await eventually(lambda: len(consumed) == 1, what="event consumed")
        assert consumed[0].data["job_id"] == "j-42" and consumed[0].source == f"/gpupool/{NAME}"
        info = await js.consumer_info(EVENTS_STREAM.name, NAME)
        assert info.config.filter_subjects == [subjects.JOB_SUBMITTED] or info.config.filter_subject == \
            subjects.JOB_SUBMITTED
    finally:
        await rt.shutdown()


async def test_event_without_a_route_is_dead_lettered_as_unsupported(
        nats_url: str, fresh_database_dsn: str, migrations_package: str, js: JetStreamContext) -> None:
    rt = runtime(nats_url, fresh_database_dsn, migrations_package)

    async def on_submitted(event: CloudEvent, data: JobSubmitted) -> None:
        return None

    await rt.start()
    try:
        # consume more than the routes handle: a JobStarted reaching this consumer has no handler
        await rt.consume(NAME, (subjects.JOB_SUBMITTED, subjects.JOB_STARTED),
                         Routes(events={JobSubmitted: idempotent(on_submitted, RECORDS_ONLY)}).dispatch, ack_wait_s=2.0)
        started = JobStarted(job_id="j", allocation_id="a", cluster="c", node="n", started_at=datetime.now(UTC))
        async with rt.uow() as uow:
            await uow.emit(started)
        await eventually(lambda: _dlq_count(js, 1), what="unsupported event dead-lettered")
        dead = await js.get_msg(subjects.DLQ_STREAM.name, 1)
        assert dead.headers["Gpupool-Dlq-Reason"] == "UnsupportedEventType"
    finally:
        await rt.shutdown()


async def _dlq_count(js: JetStreamContext, n: int) -> bool:
    return (await js.stream_info(subjects.DLQ_STREAM.name)).state.messages == n


async def test_sigterm_finishes_the_message_in_hand_flushes_its_outbox_and_closes_cleanly(
        nats_url: str, fresh_database_dsn: str, migrations_package: str, js: JetStreamContext) -> None:
    rt = runtime(nats_url, fresh_database_dsn, migrations_package)
    entered, release = asyncio.Event(), asyncio.Event()

    async def on_submitted(event: CloudEvent, data: JobSubmitted) -> None:
        entered.set()
        await release.wait()
        async with rt.uow() as uow:
            await uow.emit(JobStarted(job_id=data.job_id, allocation_id="a-1", cluster="c", node="n",
                                      started_at=datetime.now(UTC)))

    await rt.start()
    await rt.mount(Routes(events={JobSubmitted: idempotent(on_submitted, RECORDS_ONLY)}))
    async with rt.uow() as uow:
        await uow.emit(job("j-1"))
    await asyncio.wait_for(entered.wait(), 5)

    running = asyncio.create_task(rt.run_until_signalled())
    await eventually(lambda: signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL, timeout=2,
                     what="SIGTERM handler installed")
    os.kill(os.getpid(), signal.SIGTERM)
    await asyncio.sleep(0.2)
    assert not running.done()  # waiting for the handler in hand
    release.set()
    await asyncio.wait_for(running, 10)

    assert rt.nc.is_closed

    async def acked() -> bool:  # acked before exit (the server applies acks asynchronously: short wait)
        info = await js.consumer_info(EVENTS_STREAM.name, NAME)
        return info.num_ack_pending == 0 and info.num_pending == 0

    await eventually(acked, timeout=2, what="the in-hand message acked")
    last = await js.get_last_msg(EVENTS_STREAM.name, subjects.JOB_STARTED)
    assert CloudEvent.model_validate_json(last.data).data["job_id"] == "j-1"  # its outbox row was flushed
