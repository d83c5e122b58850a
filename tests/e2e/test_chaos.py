"""The short version of `task chaos`: a `gpupool up` with its own NATS and PostgreSQL and two placement replicas,
a steady load of submissions, completions and cancellations over HTTP (a third of the jobs run a real command on
the simulated fleet), and one round each of: SIGKILL of the placement leader, SIGKILL of the agent while jobs'
commands run on its nodes (each must still end with its own exit code, none lost), a NATS restart, a PostgreSQL
crash and restart, an agent partitioned from the bus and healed, and a flood of poison messages. Every round must
recover and pass `gpupool check`; no accepted job may be lost, no command may end otherwise than its exit code says,
and no GPU may be held twice. Then the checker is shown to fail on that same real platform: a second live holder of
a GPU, inserted with the trigger disabled, is found and named."""

from __future__ import annotations

import asyncio

import asyncpg
import pytest

from libs.chaos.suite import Platform, passed, run_chaos
from libs.check import CheckConfig, check_async

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

FAULTS = ["kill:placement", "kill:agent", "restart:nats", "restart:postgres", "partition:agent", "poison:consumers",
          "forge:policy"]


async def corrupt_and_check(platform: Platform, injected: frozenset[str]) -> None:
    config = CheckConfig.from_run_file(platform.data_dir / "run.json", settle_s=20, injected=injected)
    clean = await check_async(config)
    assert clean.ok, clean.to_text()
    dsn = platform.run["database_urls"]["placement"]
    conn = await asyncpg.connect(dsn)
    try:
        gpu = await conn.fetchval("SELECT gpu_uuid FROM allocation_gpus WHERE share_milli = 1000 LIMIT 1")
        node = await conn.fetchval("SELECT node FROM gpus WHERE uuid = $1", gpu)
        async with conn.transaction():
            await conn.execute("ALTER TABLE allocation_gpus DISABLE TRIGGER allocation_gpus_fit")
            await conn.execute("DROP INDEX allocation_gpus_one_whole_holder")
            for n in (1, 2):
                await conn.execute(
                    """INSERT INTO allocations (allocation_id, job_id, team, project, cluster, node, granted_at)
                       VALUES ($1, $2, 'research', 'default', 'local', $3, now())""", f"twin-{n}", f"twin-job-{n}", node)
                await conn.execute("INSERT INTO allocation_gpus (allocation_id, gpu_uuid, gpu_index, model) "
                                   "VALUES ($1, $2, 0, 'H100-80GB')", f"twin-{n}", gpu)
            await conn.execute("ALTER TABLE allocation_gpus ENABLE TRIGGER allocation_gpus_fit")
    finally:
        await conn.close()
    report = await check_async(CheckConfig.from_run_file(platform.data_dir / "run.json", injected=injected))
    held = [v for v in report.violations if v.kind == "gpu_double_held"]
    assert [v.subject for v in held] == [gpu], report.to_text()
    assert "twin-1" in held[0].detail and "twin-2" in held[0].detail


def test_short_chaos_run_loses_nothing_and_check_passes_after_every_round() -> None:
    result = asyncio.run(run_chaos(rounds=len(FAULTS), faults=FAULTS, rate=2.0, seed=1, settle_s=30,
                                   warmup_s=3, gap_s=1, before_stop=corrupt_and_check))
    failed = [r for r in result["rounds"] if not (r["recovered"] and r["check_ok"])]
    assert not failed, failed
    assert result["jobs"]["lost"] == 0, result["jobs"]
    assert result["jobs"]["accepted"] > 20
    # jobs' commands ran and ended as their exit codes said, also those running when the agent was SIGKILLed
    assert result["jobs"]["work_jobs"] > 5 and not result["jobs"]["work_misended"], result["jobs"]
    outcomes = result["jobs"]["work_outcomes"]
    assert outcomes.get("marker → failed (exit 5)") == outcomes.get("marker → failed (exit 6)") == 1, outcomes
    agent = next(r for r in result["rounds"] if r["spec"] == "kill:agent")
    assert "ended as their exit codes said" in agent["note"] and "WRONG" not in agent["note"], agent
    assert result["double_allocations"] == 0
    assert result["final_check"]["ok"], result["final_check"]
    # each poison message was dead-lettered; nothing else was, but telemetry samples a consumer could not store
    # while PostgreSQL was down (max_deliver 3: a sample is superseded by the next one a second later)
    assert result["dead_letters"], result
    assert all(d["other"] == 0 for key, d in result["dead_letters"].items()
               if key not in ("inventory-telemetry / MaxDeliveriesExceeded",
                              "reclamation-telemetry / MaxDeliveriesExceeded")), result["dead_letters"]
    assert passed(result)
