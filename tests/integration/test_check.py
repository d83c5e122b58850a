"""`gpupool check` against a real world: quota, queue, placement and accounting run in this process on real NATS
and PostgreSQL (their own databases, their own code), jobs are submitted, placed (whole GPUs, MIG slices,
fractions), completed and cancelled through the queue's commands. The checker must find that world clean — and
then find each corruption made on purpose (a second live holder with the trigger disabled, a job state changed
behind its events, an event deleted from the stream, an outbox row left unpublished, a ledger row off by a
microsecond, a genuine event dead-lettered, a consumer left behind), each by the check that owns it, and be clean
again once the corruption is undone."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime

import asyncpg
import pytest
import pytest_asyncio
from nats.js.api import AckPolicy, ConsumerConfig

from libs.bus.connection import connect
from libs.bus.publisher import MSG_ID_HEADER, publish_event, publish_raw
from libs.bus.rpc import request
from libs.check import CheckConfig, Report, check_async
from libs.contracts import subjects
from libs.contracts.commands import CancelJob, JobRef, SubmitJob
from libs.contracts.events import GpuSharingSet, GpuSpec, NodeRegistered, subject_for
from libs.runtime.service import ServiceRuntime
from libs.store.database import with_database
from services.accounting.bootstrap import mount as mount_accounting
from services.accounting.config import AccountingSettings
from services.accounting.handlers import AccountingHandlers
from services.inventory.config import InventorySettings
from services.inventory.handlers import InventoryHandlers
from services.inventory.handlers import routes as inventory_routes
from services.placement.config import PlacementSettings
from services.placement.handlers import PlacementHandlers
from services.placement.handlers import routes as placement_routes
from services.queue.config import QueueSettings
from services.queue.handlers import QueueHandlers
from services.queue.handlers import routes as queue_routes
from services.quota.config import QuotaSettings
from services.quota.handlers import QuotaHandlers
from services.quota.handlers import routes as quota_routes
from services.reclamation.config import ReclamationSettings
from services.reclamation.handlers import ReclamationHandlers
from services.reclamation.handlers import routes as reclamation_routes

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("keep_test_logging_and_tracing"),
              pytest.mark.asyncio(loop_scope="module")]

SERVICES = ("quota", "queue", "placement", "accounting", "inventory", "reclamation")
INVENTORY = "/gpupool/inventory"


class World:
    """The services that own jobs, allocations and the ledger, in-process, on their own databases."""

    def __init__(self, nats_url: str, admin_dsn: str, *, every_consumer: bool = False) -> None:
        self.every_consumer = every_consumer  # also inventory and reclamation: every service that consumes events
        self.nats_url = nats_url
        self.admin_dsn = admin_dsn
        self.prefix = f"chk_{uuid.uuid4().hex[:8]}"
        self.runtimes: dict[str, ServiceRuntime] = {}
        self.jobs: dict[str, str] = {}  # name → job id

    def dsn(self, service: str) -> str:
        return with_database(self.admin_dsn, f"{self.prefix}_{service}")

    def config(self, **overrides: object) -> CheckConfig:
        return CheckConfig(database_urls={s: self.dsn(s) for s in ("queue", "placement", "accounting")},
                           nats_url=self.nats_url, **overrides)  # type: ignore[arg-type]

    def settings(self, cls, service: str, **extra):  # type: ignore[no-untyped-def]
        return cls(nats_url=self.nats_url, database_url=self.dsn(service), http_port=0, log_level="WARNING",
                   instance=f"{service}-check-test", **extra)

    async def start(self) -> None:
        quota = ServiceRuntime("quota", self.settings(QuotaSettings, "quota"), migrations_package="services.quota")
        await quota.start()
        handlers = QuotaHandlers(quota)
        await handlers.seed(["research", "inference"])
        await quota.mount(quota_routes(handlers))
        self.runtimes["quota"] = quota

        queue_settings = self.settings(QueueSettings, "queue")
        queue = ServiceRuntime("queue", queue_settings, migrations_package="services.queue")
        await queue.start()
        await queue.mount(queue_routes(QueueHandlers(queue, queue_settings)))
        self.runtimes["queue"] = queue

        placement_settings = self.settings(PlacementSettings, "placement", cycle_interval_s=0.2)
        placement = ServiceRuntime("placement", placement_settings, migrations_package="services.placement")
        await placement.start()
        placer = PlacementHandlers(placement, placement_settings, None)
        await placement.mount(placement_routes(placer))
        placement.background(placer.reconcile_policy(), "policy-reconcile")
        placement.background(placer.scheduling_loop(), "scheduling-loop")
        self.runtimes["placement"] = placement

        accounting_settings = self.settings(AccountingSettings, "accounting")
        accounting = ServiceRuntime("accounting", accounting_settings, migrations_package="services.accounting")
        await accounting.start()
        await mount_accounting(accounting, AccountingHandlers(accounting, accounting_settings))
        self.runtimes["accounting"] = accounting

        if self.every_consumer:
            inventory_settings = self.settings(InventorySettings, "inventory")
            inventory = ServiceRuntime("inventory", inventory_settings, migrations_package="services.inventory")
            await inventory.start()
            await inventory.mount(inventory_routes(InventoryHandlers(inventory, inventory_settings)))
            self.runtimes["inventory"] = inventory
            reclamation_settings = self.settings(ReclamationSettings, "reclamation")
            reclamation = ServiceRuntime("reclamation", reclamation_settings,
                                         migrations_package="services.reclamation")
            await reclamation.start()
            reclaimer = ReclamationHandlers(reclamation, reclamation_settings)
            await reclamation.mount(reclamation_routes(reclaimer))
            reclamation.background(reclaimer.sweep_loop(), "reclaim-sweep")
            self.runtimes["reclamation"] = reclamation

        now = datetime.now(UTC)
        fleet = {"whole-0": ("H100-80GB", 6, False), "mig-0": ("H100-80GB", 2, True),
                 "frac-0": ("L40S", 2, False)}
        for node, (model, count, mig) in fleet.items():
            await self.publish(NodeRegistered(
                cluster="c1", node=node, hostname=node, cpu_count=64, memory_mib=1 << 19, registered_at=now,
                gpus=[GpuSpec(uuid=f"GPU-{node}-{i}", index=i, model=model, memory_mib=81920 if "H100" in model
                              else 46068, mig_mode=mig) for i in range(count)]))
        for i in range(2):
            await self.publish(GpuSharingSet(cluster="c1", node="frac-0", gpu_uuid=f"GPU-frac-0-{i}", gpu_index=i,
                                             mode="fractional", set_at=now))

    async def publish(self, data) -> None:  # type: ignore[no-untyped-def]
        await publish_event(self.runtimes["queue"].js, subject_for(data), data.to_cloudevent(INVENTORY))

    async def submit(self, name: str, **shape: object) -> str:
        cmd = SubmitJob(name=name, team=str(shape.pop("team", "research")), **shape)  # type: ignore[arg-type]
        reply = await request(self.runtimes["queue"].nc, subjects.CMD_QUEUE_SUBMIT_JOB, cmd, timeout=10)
        assert reply.ok, reply.error
        self.jobs[name] = reply.result["job_id"]
        return self.jobs[name]

    async def command(self, subject: str, cmd) -> dict:  # type: ignore[no-untyped-def]
        reply = await request(self.runtimes["queue"].nc, subject, cmd, timeout=10)
        assert reply.ok, reply.error
        return reply.result

    async def state(self, name: str) -> str:
        return (await self.command(subjects.QUERY_QUEUE_GET_JOB, JobRef(job_id=self.jobs[name])))["state"]

    async def wait_state(self, name: str, want: str, timeout: float = 20) -> None:
        deadline = asyncio.get_running_loop().time() + timeout
        while (got := await self.state(name)) != want:
            assert asyncio.get_running_loop().time() < deadline, f"{name} is {got}, never {want}"
            await asyncio.sleep(0.05)

    async def stop(self) -> None:
        for name in reversed(list(self.runtimes)):
            await self.runtimes[name].shutdown()
        admin = await asyncpg.connect(self.admin_dsn)
        try:
            for service in SERVICES:
                await admin.execute(f'DROP DATABASE IF EXISTS "{self.prefix}_{service}" WITH (FORCE)')
        finally:
            await admin.close()


async def started_world(nats_url: str, pg_admin_dsn: str) -> World:
    """A World on streams emptied of earlier modules' events (the checker reads whole streams)."""
    nc = await connect(nats_url, "check-test-cleaner")
    js = nc.jetstream()
    for info in await js.streams_info():
        await js.delete_stream(info.config.name)
    await nc.close()
    w = World(nats_url, pg_admin_dsn)
    await w.start()
    return w


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def world(nats_url: str, pg_admin_dsn: str) -> AsyncIterator[World]:
    w = await started_world(nats_url, pg_admin_dsn)
    try:
        for i in range(3):
            await w.submit(f"whole-{i}", gpus=1, gpu_models=["H100-80GB"])
        await w.submit("pair", gpus=2, gpu_models=["H100-80GB"])
        await w.submit("mig", gpus=1, mig_profile="3g.40gb", gpu_models=["H100-80GB"])
        await w.submit("frac-a", gpus=1, gpu_fraction_milli=500, gpu_memory_mib=20000, gpu_models=["L40S"])
        await w.submit("frac-b", gpus=1, gpu_fraction_milli=250, gpu_memory_mib=10000, gpu_models=["L40S"])
        await w.submit("waiting", gpus=8, gpu_models=["H100-80GB"])  # never fits: stays pending
        for name in ("whole-0", "whole-1", "whole-2", "pair", "mig", "frac-a", "frac-b"):
            await w.wait_state(name, "running")
        await w.command(subjects.CMD_QUEUE_COMPLETE_JOB, JobRef(job_id=w.jobs["whole-0"]))
        await w.command(subjects.CMD_QUEUE_CANCEL_JOB, CancelJob(job_id=w.jobs["whole-1"]))
        await w.command(subjects.CMD_QUEUE_COMPLETE_JOB, JobRef(job_id=w.jobs["frac-b"]))
        await w.command(subjects.CMD_QUEUE_CANCEL_JOB, CancelJob(job_id=w.jobs["waiting"]))
        await w.submit("late", gpus=1, gpu_models=["H100-80GB"])
        await w.wait_state("late", "running")
        report = await settled(w)
        assert report.ok, report.to_text()
        yield w
    finally:
        await w.stop()


async def settled(w: World, timeout: float = 20) -> Report:
    """Clean as soon as every consumer has applied what it was sent (the checker itself never waits)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        report = await check_async(w.config())
        if report.ok or asyncio.get_running_loop().time() > deadline:
            return report
        await asyncio.sleep(0.2)


async def published(w: World, service: str, timeout: float = 30) -> None:
    """Until the service's relay has published every outbox row (a clean check allows young unpublished ones)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while (left := (await sql(w, service, "SELECT count(*) AS n FROM outbox WHERE published_at IS NULL"))[0]["n"]):  # type: ignore[index]
        assert asyncio.get_running_loop().time() < deadline, f"{service}: {left} outbox rows still unpublished"
        await asyncio.sleep(0.1)


def kinds(report: Report, check: str) -> set[str]:
    return {v.kind for v in report.violations if v.check == check}


async def sql(w: World, service: str, statement: str, *args: object) -> object:
    conn = await asyncpg.connect(w.dsn(service))
    try:
        if not args and ";" in statement:  # a script (several statements): no rows
            return await conn.execute(statement)
        return await conn.fetch(statement, *args)
    finally:
        await conn.close()


async def test_the_real_world_is_clean_and_every_check_ran(world: World) -> None:
    report = await check_async(world.config())
    assert report.ok, report.to_text()
    # this world runs no inventory (placement learns its nodes from events): telemetry is judged in the e2e runs
    assert set(report.skipped) == {"telemetry_liveness"}, report.skipped
    assert report.checked["gpu_exclusive"] >= 6 and report.checked["job_state"] == 9
    assert report.checked["allocation_events"] >= 8 and report.checked["ledger"] >= 8
    assert report.info["quota_use"]  # someone holds GPUs
    assert report.info["quota_use"]["research/H100-80GB"] > 0


async def test_a_second_live_holder_of_a_gpu_is_caught(world: World) -> None:
    rows = await sql(world, "placement", """SELECT a.allocation_id, a.job_id, g.gpu_uuid FROM allocations a
                                           JOIN allocation_gpus g USING (allocation_id)
                                           WHERE a.released_at IS NULL AND g.share_milli = 1000
                                             AND g.mig_profile IS NULL LIMIT 1""")
    victim = rows[0]  # type: ignore[index]
    intruder = f"intruder-{uuid.uuid4().hex[:6]}"
    await sql(world, "placement", f"""
        BEGIN;
        ALTER TABLE allocation_gpus DISABLE TRIGGER allocation_gpus_fit;
        DROP INDEX allocation_gpus_one_whole_holder;
        INSERT INTO allocations (allocation_id, job_id, team, project, cluster, node, granted_at)
            VALUES ('{intruder}', 'intruder-job', 'research', 'default', 'c1', 'whole-0', now());
        INSERT INTO allocation_gpus (allocation_id, gpu_uuid, gpu_index, model)
            VALUES ('{intruder}', '{victim["gpu_uuid"]}', 0, 'H100-80GB');
        ALTER TABLE allocation_gpus ENABLE TRIGGER allocation_gpus_fit;
        COMMIT;""")
    report = await check_async(world.config())
    held = [v for v in report.violations if v.kind == "gpu_double_held"]
    assert len(held) == 1 and held[0].subject == victim["gpu_uuid"], report.to_text()
    assert victim["allocation_id"] in held[0].detail and intruder in held[0].detail
    # the intruder has no events, no job, no ledger: each owner says so
    assert "granted_missing" in kinds(report, "allocation_events")
    assert "allocation_for_unknown_job" in kinds(report, "job_placement")
    assert "use_differs_from_events" in kinds(report, "quota_use")
    await sql(world, "placement", f"""
        BEGIN;
        DELETE FROM allocation_gpus WHERE allocation_id = '{intruder}';
        DELETE FROM allocations WHERE allocation_id = '{intruder}';
        CREATE UNIQUE INDEX allocation_gpus_one_whole_holder ON allocation_gpus (gpu_uuid)
            WHERE live AND share_milli = 1000 AND mig_profile IS NULL;
        COMMIT;""")
    assert (await check_async(world.config())).ok


async def test_overlapping_mig_slices_and_overfull_fractions_are_caught(world: World) -> None:
    mig = (await sql(world, "placement", """SELECT allocation_id, gpu_uuid, mig_start, mig_slots, mig_profile
                                            FROM allocation_gpus WHERE live AND mig_profile IS NOT NULL"""))[0]  # type: ignore[index]
    frac = (await sql(world, "placement", """SELECT allocation_id, gpu_uuid FROM allocation_gpus
                                             WHERE live AND share_milli < 1000 AND mig_profile IS NULL"""))[0]  # type: ignore[index]
    await sql(world, "placement", f"""
        BEGIN;
        ALTER TABLE allocation_gpus DISABLE TRIGGER allocation_gpus_fit;
        INSERT INTO allocations (allocation_id, job_id, replica, team, project, cluster, node, granted_at)
            VALUES ('bad-mig', '{world.jobs["late"]}', 7, 'research', 'default', 'c1', 'mig-0', now()),
                   ('bad-frac', '{world.jobs["late"]}', 8, 'research', 'default', 'c1', 'frac-0', now());
        INSERT INTO allocation_gpus (allocation_id, gpu_uuid, gpu_index, model, share_milli, mig_profile, mig_start,
                                     mig_slots)
            VALUES ('bad-mig', '{mig["gpu_uuid"]}', 0, 'H100-80GB', 142, '1g.10gb', {mig["mig_start"]}, 1);
        INSERT INTO allocation_gpus (allocation_id, gpu_uuid, gpu_index, model, share_milli, memory_mib)
            VALUES ('bad-frac', '{frac["gpu_uuid"]}', 0, 'L40S', 600, 1000);
        ALTER TABLE allocation_gpus ENABLE TRIGGER allocation_gpus_fit;
        COMMIT;""")
    report = await check_async(world.config())
    found = {(v.kind, v.subject) for v in report.violations if v.check == "gpu_exclusive"}
    assert ("mig_slot_double_held", mig["gpu_uuid"]) in found, report.to_text()
    assert ("fraction_over_compute", frac["gpu_uuid"]) in found, report.to_text()
    await sql(world, "placement", """DELETE FROM allocation_gpus WHERE allocation_id IN ('bad-mig', 'bad-frac');
                                     DELETE FROM allocations WHERE allocation_id IN ('bad-mig', 'bad-frac')""")
    assert (await check_async(world.config())).ok


async def test_a_job_state_changed_behind_its_events_is_caught(world: World) -> None:
    job = world.jobs["whole-2"]
    await sql(world, "queue", "UPDATE jobs SET state = 'completed' WHERE job_id = $1", job)
    report = await check_async(world.config())
    mismatch = [v for v in report.violations if v.kind == "job_state_mismatch"]
    assert [v.subject for v in mismatch] == [job], report.to_text()
    assert "queue says completed" in mismatch[0].detail and "end in running" in mismatch[0].detail
    await sql(world, "queue", "UPDATE jobs SET state = 'running' WHERE job_id = $1", job)
    assert (await check_async(world.config())).ok


async def test_an_event_deleted_from_the_stream_is_caught(world: World) -> None:
    js = world.runtimes["queue"].js
    rows = await sql(world, "queue", """SELECT event_id, payload FROM outbox
                                        WHERE subject = 'gpupool.job.state_changed' ORDER BY seq LIMIT 1 OFFSET 3""")
    event_id = rows[0]["event_id"]  # type: ignore[index]
    seq = (await js.get_msg(subjects.EVENTS_STREAM.name, seq=1, next=True, subject=subjects.JOB_STATE_CHANGED))
    while seq.headers.get(MSG_ID_HEADER) != event_id:  # type: ignore[union-attr]
        seq = await js.get_msg(subjects.EVENTS_STREAM.name, seq=seq.seq + 1, next=True,
                               subject=subjects.JOB_STATE_CHANGED)
    await js.delete_msg(subjects.EVENTS_STREAM.name, seq.seq)
    report = await check_async(world.config())
    assert {(v.kind, v.subject) for v in report.violations if v.check == "event_delivery"} == {
        ("event_missing_from_stream", event_id)}, report.to_text()
    assert "job_event_missing" in kinds(report, "job_state")
    # put the same event back (JetStream still remembers the deleted message id, so under another one): clean again
    await publish_raw(js, subjects.JOB_STATE_CHANGED, bytes(rows[0]["payload"]),  # type: ignore[index]
                      {MSG_ID_HEADER: f"{event_id}:restored"})
    assert (await check_async(world.config())).ok


async def test_an_outbox_row_left_unpublished_is_caught(world: World) -> None:
    await sql(world, "accounting", """INSERT INTO outbox (event_id, subject, payload, created_at)
                                      VALUES ('stuck-1', 'gpupool.usage.recorded', '{}', now() - interval '5 minutes')""")
    report = await check_async(world.config(outbox_max_age_s=60))
    stuck = [v for v in report.violations if v.check == "outbox"]
    assert [(v.kind, v.subject) for v in stuck] == [("outbox_stuck", "accounting")], report.to_text()
    assert "stuck-1" in stuck[0].detail
    assert (await check_async(world.config(outbox_max_age_s=600))).ok  # within a looser bound it is not stuck
    await sql(world, "accounting", "DELETE FROM outbox WHERE event_id = 'stuck-1'")


async def test_a_ledger_off_by_a_microsecond_and_a_missing_interval_are_caught(world: World) -> None:
    done = world.jobs["whole-0"]
    await sql(world, "accounting", "UPDATE usage_ledger SET gpu_milli_us = gpu_milli_us + 1 WHERE job_id = $1", done)
    report = await check_async(world.config())
    assert kinds(report, "ledger") == {"ledger_row_wrong", "usage_event_wrong"}, report.to_text()
    await sql(world, "accounting", "UPDATE usage_ledger SET gpu_milli_us = gpu_milli_us - 1 WHERE job_id = $1", done)
    running = world.jobs["pair"]
    saved = await sql(world, "accounting", "SELECT * FROM gpu_intervals WHERE job_id = $1", running)
    await sql(world, "accounting", "DELETE FROM gpu_intervals WHERE job_id = $1", running)
    report = await check_async(world.config())
    assert kinds(report, "ledger") == {"intervals_missing"}, report.to_text()
    conn = await asyncpg.connect(world.dsn("accounting"))
    try:
        cols = list(saved[0].keys())  # type: ignore[index]
        await conn.executemany(
            f"INSERT INTO gpu_intervals ({', '.join(cols)}) VALUES ({', '.join(f'${i + 1}' for i in range(len(cols)))})",
            [tuple(r.values()) for r in saved])  # type: ignore[attr-defined]
    finally:
        await conn.close()
    assert (await check_async(world.config())).ok


async def test_a_genuine_event_dead_lettered_and_a_stalled_consumer_are_caught(world: World) -> None:
    js = world.runtimes["queue"].js
    row = (await sql(world, "placement", """SELECT event_id, payload FROM outbox
                                            WHERE subject = 'gpupool.allocation.granted' LIMIT 1"""))[0]  # type: ignore[index]
    await publish_raw(js, subjects.dead_letter("accounting"), bytes(row["payload"]), {
        MSG_ID_HEADER: f"dlq-test-{uuid.uuid4().hex}", "Gpupool-Dlq-Reason": "MaxDeliveriesExceeded",
        "Gpupool-Dlq-Error": "database unavailable", "Gpupool-Dlq-Consumer": "accounting",
        "Gpupool-Dlq-Subject": subjects.ALLOCATION_GRANTED, "Gpupool-Dlq-Stream": subjects.EVENTS_STREAM.name,
        "Gpupool-Dlq-Stream-Seq": "1"})
    # poison that no service emitted is reported as a dead letter, not as a violation
    await publish_raw(js, subjects.dead_letter("placement"), b"\x00garbage", {
        MSG_ID_HEADER: f"dlq-test-{uuid.uuid4().hex}", "Gpupool-Dlq-Reason": "InvalidMessage",
        "Gpupool-Dlq-Consumer": "placement"})
    # a durable consumer nobody serves: whatever it has not acknowledged only gets older
    await js.add_consumer(subjects.EVENTS_STREAM.name, ConsumerConfig(
        durable_name="stalled-test", ack_policy=AckPolicy.EXPLICIT, filter_subject=subjects.JOB_STATE_CHANGED))
    await asyncio.sleep(1.2)
    try:
        report = await check_async(world.config(lag_max_age_s=1.0))
        dead = [v for v in report.violations if v.check == "dead_letters"]
        assert [(v.kind, v.subject) for v in dead] == [("event_dead_lettered", row["event_id"])], report.to_text()
        assert report.info["dead_letters"] == {"accounting/MaxDeliveriesExceeded": 1, "placement/InvalidMessage": 1}
        lag = [v for v in report.violations if v.check == "consumer_lag"]
        assert [v.subject for v in lag] == [f"{subjects.EVENTS_STREAM.name}/stalled-test"], report.to_text()
    finally:
        await js.delete_consumer(subjects.EVENTS_STREAM.name, "stalled-test")
        await js.purge_stream(subjects.DLQ_STREAM.name)
    assert (await check_async(world.config())).ok
