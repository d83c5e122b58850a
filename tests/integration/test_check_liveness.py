"""`gpupool check`'s liveness checks on the real services of test_check.py: a platform that stops scheduling passes
every safety invariant, so the checker must notice that wanted work is not being considered. The world runs healthy
(a running job, a backlog that never fits), then placement is stopped, a job is submitted, and its rows are aged by
moving their timestamps into the past (never by waiting): the queue wants it, placement never heard of it
(`job_not_known_to_placement`). Placement comes back consuming but not scheduling, like a stalled leader: it knows the
job but no cycle considers it (`job_never_considered`) and it has decided nothing since
(`no_decision_since_submission`). Within a looser bound, or for a job younger than the bound, nothing is reported;
once the scheduling loop runs again the world is clean."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
from test_check import World, published, settled, sql, started_world

from libs.check import Report, check_async
from libs.runtime.service import ServiceRuntime
from services.placement.config import PlacementSettings
from services.placement.handlers import PlacementHandlers
from services.placement.handlers import routes as placement_routes

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("keep_test_logging_and_tracing"),
              pytest.mark.asyncio(loop_scope="module")]

LIVENESS = ("job_liveness", "scheduler_progress")


def liveness(report: Report) -> set[tuple[str, str]]:
    return {(v.kind, v.subject) for v in report.violations if v.check in LIVENESS}


async def age_job(w: World, job_id: str, interval: str) -> None:
    """Move everything the queue recorded about the job `interval` into the past."""
    await sql(w, "queue", f"""UPDATE outbox SET created_at = created_at - interval '{interval}',
                                               published_at = published_at - interval '{interval}'
                              WHERE convert_from(payload, 'UTF8') LIKE '%{job_id}%'""")
    await sql(w, "queue", f"UPDATE jobs SET submitted_at = submitted_at - interval '{interval}' WHERE job_id = $1",
              job_id)
    await sql(w, "queue", f"UPDATE job_history SET at = at - interval '{interval}' WHERE job_id = $1", job_id)


async def age_placement(w: World, job_ids: list[str], interval: str) -> None:
    """Move placement's wanted rows of the jobs and every decision it recorded `interval` into the past (their order,
    decisions before a job's submission or after, is kept)."""
    await sql(w, "placement", f"""UPDATE pending_jobs SET submitted_at = submitted_at - interval '{interval}'
                                  WHERE job_id = ANY($1::text[])""", job_ids)
    await sql(w, "placement", f"UPDATE decisions SET decided_at = decided_at - interval '{interval}'")


async def wait_for(w: World, service: str, query: str, *args: object, timeout: float = 30) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not await sql(w, service, query, *args):
        assert asyncio.get_running_loop().time() < deadline, f"never: {query} {args}"
        await asyncio.sleep(0.1)


async def start_placement(w: World, *, schedule: bool) -> PlacementHandlers:
    settings = w.settings(PlacementSettings, "placement", cycle_interval_s=0.2)
    rt = ServiceRuntime("placement", settings, migrations_package="services.placement")
    await rt.start()
    placer = PlacementHandlers(rt, settings, None)
    await rt.mount(placement_routes(placer))
    if schedule:
        rt.background(placer.scheduling_loop(), "scheduling-loop")
    w.runtimes["placement"] = rt
    return placer


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def world(nats_url: str, pg_admin_dsn: str) -> AsyncIterator[World]:
    w = await started_world(nats_url, pg_admin_dsn)
    try:
        await w.submit("running", gpus=1, gpu_models=["H100-80GB"])
        await w.submit("backlog", gpus=8, gpu_models=["H100-80GB"])  # never fits: waits with a reason
        await w.wait_state("running", "running")
        await wait_for(w, "placement", "SELECT 1 FROM pending_jobs WHERE job_id = $1 AND reason IS NOT NULL",
                       w.jobs["backlog"])
        assert (report := await settled(w)).ok, report.to_text()
        yield w
    finally:
        await w.stop()


async def test_a_healthy_platform_passes_even_with_an_old_backlog(world: World) -> None:
    report = await check_async(world.config())
    assert report.ok, report.to_text()
    assert report.checked["job_liveness"] == 1 and "job_liveness" not in report.skipped
    assert "scheduler_progress" not in report.skipped
    # the backlog as if submitted ten minutes ago, placement's decisions with it: it waits, with a reason, and
    # placement decided after it came; its reasons did not change since, so nothing newer was recorded: no stall
    await age_job(world, world.jobs["backlog"], "10 minutes")
    await age_placement(world, [world.jobs["backlog"]], "10 minutes")
    report = await check_async(world.config())
    assert report.ok, report.to_text()
    assert report.checked["scheduler_progress"] == 1


async def test_a_stopped_then_stalled_scheduler_is_caught_within_its_bounds(world: World) -> None:
    await world.runtimes["placement"].shutdown()
    back = False
    try:
        job = await world.submit("lost", gpus=1, gpu_models=["H100-80GB"])
        young = await world.submit("young", gpus=1, gpu_models=["H100-80GB"])
        # placement is away: the queue wants the job for five minutes, placement never heard of it
        await age_job(world, job, "5 minutes")
        event = (await sql(world, "queue", """SELECT event_id FROM outbox WHERE subject = 'gpupool.job.submitted'
                                              AND convert_from(payload, 'UTF8') LIKE $1""", f"%{job}%"))[0]  # type: ignore[index]
        report = await check_async(world.config())
        assert liveness(report) == {("job_not_known_to_placement", job)}, report.to_text()
        (v,) = [v for v in report.violations if v.check == "job_liveness"]
        assert event["event_id"] in v.detail and "published at" in v.detail and "never applied by placement" in v.detail
        assert 300 <= v.data["age_s"] < 600 and v.data["bound_s"] == 60.0
        # the bound is honoured: within ten minutes it is not late yet (and the young job never was)
        assert liveness(await check_async(world.config(pending_max_age_s=600))) == set()
        # consumer_lag names the consumer nobody serves now, and what its oldest message waits on (bound 0: any age);
        # both submissions are in the stream once the queue's relay has published them
        await published(world, "queue")
        lag = [v for v in (await check_async(world.config(lag_max_age_s=0))).violations
               if v.subject == "GPUPOOL_EVENTS/placement"]
        assert len(lag) == 1 and lag[0].data["consumer"] == "placement" and lag[0].data["num_pending"] >= 2, lag
        # (a pull request of the stopped replica the server had not dropped yet would have been handed the message)
        assert ("delivered, never acknowledged" if lag[0].data["delivered"] else
                "never delivered; no pull request is waiting: nobody is fetching") in lag[0].detail, lag[0].detail

        # placement back, consuming but not scheduling (a stalled leader): it knows the job, no cycle considers it
        placer = await start_placement(world, schedule=False)
        back = True
        await wait_for(world, "placement", "SELECT 1 FROM pending_jobs WHERE job_id = $1", job)
        await wait_for(world, "placement", "SELECT 1 FROM pending_jobs WHERE job_id = $1", young)
        await age_placement(world, [job, world.jobs["backlog"]], "5 minutes")  # not the young one
        report = await check_async(world.config())
        assert liveness(report) == {("job_never_considered", job),
                                    ("no_decision_since_submission", "placement")}, report.to_text()
        never = next(v for v in report.violations if v.kind == "job_never_considered")
        assert "no scheduling cycle has given it a reason" in never.detail
        assert "latest recorded decision is from" in never.detail and never.data["latest_decision_at"]
        stall = next(v for v in report.violations if v.kind == "no_decision_since_submission")
        assert stall.data["oldest_job_id"] == job and stall.data["job_ids"] == [job], stall  # not the young one
        assert "is a leader scheduling?" in stall.detail
        loose = await check_async(world.config(pending_max_age_s=600, decision_max_age_s=600))
        assert liveness(loose) == set(), loose.to_text()
        assert loose.ok, loose.to_text()  # and nothing else is wrong with this world

        # the scheduling loop runs again: both jobs are placed, the world is clean
        world.runtimes["placement"].background(placer.scheduling_loop(), "scheduling-loop")
        await world.wait_state("lost", "running")
        await world.wait_state("young", "running")
        assert (report := await settled(world)).ok, report.to_text()
    finally:
        if not back:  # leave a running placement for the fixture to stop
            await start_placement(world, schedule=True)
