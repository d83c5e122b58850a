"""`gpupool check` under retention, on the real services of test_check.py: a world is run, then aged by 40 days
(its timestamps moved into the past, the events stream purged as its 30-day max age would have), then each
service's own pruner deletes what retention allows (published outbox rows older than 7 days, inbox rows older than
30). Old jobs and allocations have lost their events and inbox rows, and the checker must not call that a violation;
what happens after the horizon (new jobs, and the completion of a job submitted before it) is checked exactly, and a
corruption there, or of what is left of an old job, is still caught. Without the recorded horizon the same world is
a violation: the leniency comes from the horizon, nothing else."""

from __future__ import annotations

from collections.abc import AsyncIterator

import asyncpg
import pytest
import pytest_asyncio
from test_check import World, kinds, published, settled, sql, started_world

from libs.check import check_async
from libs.contracts import subjects
from libs.contracts.commands import CancelJob, JobRef

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("keep_test_logging_and_tracing"),
              pytest.mark.asyncio(loop_scope="module")]

AGE = "40 days"
# the tables whose times are moved into the past (every timestamptz column), per service
AGED = {
    "queue": ("jobs", "job_history", "outbox", "inbox"),
    "placement": ("pending_jobs", "allocations", "finished_jobs", "decisions", "outbox", "inbox"),
    "accounting": ("gpu_intervals", "usage_ledger", "open_allocations", "jobs", "queue_waits", "outbox", "inbox"),
}


async def age(w: World, service: str) -> None:
    conn = await asyncpg.connect(w.dsn(service))
    try:
        for table in AGED[service]:
            cols = [r["c"] for r in await conn.fetch(
                """SELECT column_name AS c FROM information_schema.columns
                   WHERE table_schema = current_schema() AND table_name = $1
                     AND data_type = 'timestamp with time zone'""", table)]
            if cols:  # an unpublished outbox row is not aged: it would be stuck, not old
                where = " WHERE published_at IS NOT NULL" if table == "outbox" else ""
                await conn.execute(f"UPDATE {table} SET " + ", ".join(f"{c} = {c} - interval '{AGE}'" for c in cols)
                                   + where)
    finally:
        await conn.close()


async def outbox_mentions(w: World, service: str, ident: str) -> int:
    rows = await sql(w, service, "SELECT count(*) AS n FROM outbox WHERE convert_from(payload, 'UTF8') LIKE $1",
                     f"%{ident}%")
    return int(rows[0]["n"])  # type: ignore[index]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def aged(nats_url: str, pg_admin_dsn: str) -> AsyncIterator[World]:
    w = await started_world(nats_url, pg_admin_dsn)
    try:
        # the past: a finished job, a cancelled one, one still running and one still pending at the horizon
        for name in ("old-done", "old-cancelled", "old-running"):
            await w.submit(name, gpus=1, gpu_models=["H100-80GB"])
            await w.wait_state(name, "running")
        await w.submit("old-pending", gpus=8, gpu_models=["H100-80GB"])  # never fits
        await w.command(subjects.CMD_QUEUE_COMPLETE_JOB, JobRef(job_id=w.jobs["old-done"]))
        await w.command(subjects.CMD_QUEUE_CANCEL_JOB, CancelJob(job_id=w.jobs["old-cancelled"]))
        assert (report := await settled(w)).ok, report.to_text()
        # a clean check allows young unpublished outbox rows; aging must not split such a row (kept young) from the
        # state change it records (aged): wait until every event of the past is published
        for service in AGED:
            await published(w, service)

        for service in AGED:
            await age(w, service)
        js = w.runtimes["queue"].js
        await js.purge_stream(subjects.EVENTS_STREAM.name)  # its max age (30 days) is over for all of it
        pruned = {s: await w.runtimes[s].pruner.prune_once() for s in AGED}  # type: ignore[union-attr]
        for service, p in pruned.items():
            assert p.outbox > 0 and p.inbox > 0, (service, p)
        assert await outbox_mentions(w, "queue", w.jobs["old-done"]) == 0
        assert await outbox_mentions(w, "placement", w.jobs["old-running"]) == 0

        # the present: new jobs, and the old running one completes
        await w.submit("new-done", gpus=1, gpu_models=["H100-80GB"])
        await w.submit("new-running", gpus=2, gpu_models=["H100-80GB"])
        await w.wait_state("new-done", "running")
        await w.wait_state("new-running", "running")
        await w.command(subjects.CMD_QUEUE_COMPLETE_JOB, JobRef(job_id=w.jobs["new-done"]))
        await w.command(subjects.CMD_QUEUE_COMPLETE_JOB, JobRef(job_id=w.jobs["old-running"]))
        await w.wait_state("old-running", "completed")
        yield w
    finally:
        await w.stop()


async def test_a_pruned_past_is_not_a_violation_and_every_check_still_runs(aged: World) -> None:
    report = await settled(aged)
    assert report.ok, report.to_text()
    # this world runs no inventory: telemetry is judged in the e2e runs (tests/e2e/test_chaos.py)
    assert set(report.skipped) == {"telemetry_liveness"}, report.skipped
    assert report.checked["job_state"] == 6 and report.checked["allocation_events"] == 5
    assert set(report.info["pruned_before"]) == {"queue", "placement", "accounting"}  # the horizons it honoured
    # what is left of the old running job (its completion) was judged: it is in the outbox
    assert await outbox_mentions(aged, "queue", aged.jobs["old-running"]) >= 1


async def test_without_the_recorded_horizon_the_same_world_is_a_violation(aged: World) -> None:
    saved = {s: await sql(aged, s, "SELECT what, pruned_before FROM store_retention") for s in AGED}
    for s in AGED:
        await sql(aged, s, "DELETE FROM store_retention")
    try:
        report = await check_async(aged.config())
        assert "job_without_events" in kinds(report, "job_state"), report.to_text()
        assert "granted_missing" in kinds(report, "allocation_events"), report.to_text()
        assert "ledger_ahead_of_events" in kinds(report, "ledger"), report.to_text()
        missing = {v.subject for v in report.violations if v.kind == "job_without_events"}
        assert missing == {aged.jobs[n] for n in ("old-done", "old-cancelled", "old-pending")}, report.to_text()
    finally:
        for s, rows in saved.items():
            conn = await asyncpg.connect(aged.dsn(s))
            try:
                await conn.executemany("INSERT INTO store_retention (what, pruned_before) VALUES ($1, $2)",
                                       [(r["what"], r["pruned_before"]) for r in rows])  # type: ignore[union-attr]
            finally:
                await conn.close()
    assert (await check_async(aged.config())).ok


async def test_inside_the_horizon_a_state_behind_its_events_is_caught(aged: World) -> None:
    job = aged.jobs["new-running"]
    await sql(aged, "queue", "UPDATE jobs SET state = 'completed' WHERE job_id = $1", job)
    try:
        report = await check_async(aged.config())
        assert [(v.kind, v.subject) for v in report.violations if v.check == "job_state"] == [
            ("job_state_mismatch", job)], report.to_text()
    finally:
        await sql(aged, "queue", "UPDATE jobs SET state = 'running' WHERE job_id = $1", job)
    assert (await check_async(aged.config())).ok


async def test_what_is_left_of_an_old_job_is_still_checked(aged: World) -> None:
    """Submitted before the horizon, completed after it: its first events are gone, its last must match."""
    job = aged.jobs["old-running"]
    await sql(aged, "queue", "UPDATE jobs SET state = 'failed' WHERE job_id = $1", job)
    try:
        report = await check_async(aged.config())
        mismatch = [v for v in report.violations if v.kind == "job_state_mismatch"]
        assert [v.subject for v in mismatch] == [job], report.to_text()
        assert "end in completed" in mismatch[0].detail
    finally:
        await sql(aged, "queue", "UPDATE jobs SET state = 'completed' WHERE job_id = $1", job)
    assert (await check_async(aged.config())).ok


async def test_inside_the_horizon_an_event_missing_from_the_outbox_is_caught(aged: World) -> None:
    alloc = (await sql(aged, "placement", "SELECT allocation_id FROM allocations WHERE job_id = $1",
                       aged.jobs["new-running"]))[0]["allocation_id"]  # type: ignore[index]
    conn = await asyncpg.connect(aged.dsn("placement"))
    try:
        row = await conn.fetchrow(
            """DELETE FROM outbox WHERE subject = $1 AND convert_from(payload, 'UTF8') LIKE $2 RETURNING *""",
            subjects.ALLOCATION_GRANTED, f"%{alloc}%")
        assert row is not None
        report = await check_async(aged.config())
        assert ("granted_missing", alloc) in {(v.kind, v.subject) for v in report.violations}, report.to_text()
        assert ("event_without_outbox_row", row["event_id"]) in {(v.kind, v.subject) for v in report.violations}
        cols = list(row.keys())
        await conn.execute(f"INSERT INTO outbox ({', '.join(cols)}) VALUES "
                           f"({', '.join(f'${i + 1}' for i in range(len(cols)))})", *row.values())
    finally:
        await conn.close()
    assert (await check_async(aged.config())).ok
