"""Isolation drivers on a real PostgreSQL (and NATS under the service runtime): the labels a node registers are kept
and fed to the core, a job whose work needs a driver lands only on a node that offers it, and one that no
schedulable node offers waits with a reason naming the driver in `explain`, until a node offers it."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from types import SimpleNamespace

import pytest
from nats.js import JetStreamContext

from libs.cli.decisions import replay
from libs.contracts.commands import GetDecision, JobRef
from libs.contracts.events import GpuSpec, JobSubmitted, NodeRegistered
from libs.contracts.work import WorkSpec
from libs.runtime.service import ServiceRuntime
from services.placement.config import PlacementSettings
from services.placement.handlers import PlacementHandlers

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("keep_test_logging_and_tracing")]
NOW = datetime(2026, 11, 30, tzinfo=UTC)
PROCESS = {"gpupool.io/isolation.process": "true"}
SANDBOX = {**PROCESS, "gpupool.io/isolation.sandbox": "true"}


@pytest.fixture
async def placement(nats_url: str, fresh_database_dsn: str,
                    js: JetStreamContext) -> AsyncIterator[tuple[ServiceRuntime, PlacementHandlers]]:
    settings = PlacementSettings(nats_url=nats_url, database_url=fresh_database_dsn, http_port=0, log_level="WARNING",
                                 instance="pl-drivers-test", cycle_interval_s=3600)
    rt = ServiceRuntime("placement", settings, migrations_package="services.placement")
    await rt.start()  # no routes mounted and no loop started: the test drives the cycles itself
    try:
        yield rt, PlacementHandlers(rt, settings)
    finally:
        await rt.shutdown()


async def register(h: PlacementHandlers, name: str, labels: dict[str, str], gpus: int = 2) -> None:
    """As inventory's `node.registered` arrives: through the handler (inbox and all)."""
    data = NodeRegistered(cluster="c", node=name, hostname=name, cpu_count=64, memory_mib=512_000, labels=labels,
                          registered_at=NOW,
                          gpus=[GpuSpec(uuid=f"{name}-G{i}", index=i, model="H100", memory_mib=81_920)
                                for i in range(gpus)])
    await h.on_node_registered(data.to_cloudevent("/gpupool/inventory"), data)


async def submit(h: PlacementHandlers, job_id: str, isolation: str | None, gpus: int = 1) -> None:
    work = None
    if isolation is not None:
        work = WorkSpec(command=["train.py"], isolation=isolation,  # type: ignore[arg-type]
                        image="trainer:1" if isolation == "container" else None)
    data = JobSubmitted(job_id=job_id, name=job_id, team="ml", project="default", kind="batch",
                        priority_class="normal", priority=0, gpus=gpus, submitted_at=NOW, work=work)
    await h.on_job_submitted(data.to_cloudevent("/gpupool/queue"), data)


async def nodes_of(rt: ServiceRuntime) -> dict[str, list[str]]:
    assert rt.pool is not None
    rows = await rt.pool.fetch("""SELECT job_id, node FROM allocations WHERE released_at IS NULL
                                  ORDER BY job_id, node""")
    out: dict[str, list[str]] = {}
    for r in rows:
        out.setdefault(r["job_id"], []).append(r["node"])
    return out


async def explain(h: PlacementHandlers, job_id: str) -> dict:
    reply = await h.explain(JobRef(job_id=job_id))
    assert reply.ok, reply
    return reply.result


async def test_registered_labels_are_kept_and_a_re_registration_replaces_them(placement) -> None:  # type: ignore[no-untyped-def]
    rt, h = placement
    await register(h, "n1", SANDBOX)
    assert rt.pool is not None
    assert json.loads(await rt.pool.fetchval("SELECT labels::text FROM nodes WHERE node = 'n1'")) == SANDBOX
    await register(h, "n1", PROCESS)
    assert json.loads(await rt.pool.fetchval("SELECT labels::text FROM nodes WHERE node = 'n1'")) == PROCESS


async def test_a_sandbox_job_lands_only_on_the_node_that_offers_sandbox(placement) -> None:  # type: ignore[no-untyped-def]
    rt, h = placement
    await register(h, "a-plain", PROCESS)
    await register(h, "b-box", SANDBOX)
    await submit(h, "box1", "sandbox")
    await submit(h, "box2", "sandbox")
    await submit(h, "cmd", "process", gpus=2)
    assert await h.run_cycle() == 3
    assert await nodes_of(rt) == {"box1": ["b-box"], "box2": ["b-box"], "cmd": ["a-plain"]}
    # the box is full now: a third sandbox job waits for room there, not for a driver
    await submit(h, "box3", "sandbox")
    assert await h.run_cycle() == 0
    doc = await explain(h, "box3")
    assert (doc["state"], doc["reason"]) == ("pending", "NoFeasibleNode")
    # the recorded cycle, labels and selectors in its input, replays to the same plan
    assert rt.pool is not None
    cycle_id = await rt.pool.fetchval("SELECT cycle_id FROM decisions ORDER BY cycle_id LIMIT 1")
    reply = await h.get_decision(GetDecision(cycle_id=cycle_id))
    result = replay(SimpleNamespace(**reply.result))
    assert result["same"] and result["placements"] == 3, result


async def test_with_only_process_nodes_a_sandbox_job_waits_with_the_reason_until_a_node_offers_it(placement) -> None:  # type: ignore[no-untyped-def]
    rt, h = placement
    await register(h, "plain", PROCESS)
    await submit(h, "box", "sandbox")
    await submit(h, "cmd", "process")
    assert await h.run_cycle() == 1
    assert await nodes_of(rt) == {"cmd": ["plain"]}
    doc = await explain(h, "box")
    assert (doc["state"], doc["reason"]) == ("pending", "NoNodeOffersIsolation"), doc
    assert "'sandbox'" in doc["message"] and "gpupool.io/isolation.sandbox=true" in doc["message"]
    # the node's agent now can run sandboxes (bubblewrap installed) and registers again
    await register(h, "plain", SANDBOX)
    assert await h.run_cycle() == 1
    assert await nodes_of(rt) == {"box": ["plain"], "cmd": ["plain"]}
    assert (await explain(h, "box"))["state"] == "allocated"


async def test_a_node_without_labels_takes_jobs_without_work_but_no_command(placement) -> None:  # type: ignore[no-untyped-def]
    rt, h = placement
    await register(h, "legacy", {})  # registered by an agent that runs no work (or one older than the executor)
    await submit(h, "bare", None)
    await submit(h, "cmd", "process")
    assert await h.run_cycle() == 1
    assert await nodes_of(rt) == {"bare": ["legacy"]}
    doc = await explain(h, "cmd")
    assert (doc["reason"], "'process'" in doc["message"]) == ("NoNodeOffersIsolation", True)
    # a requeue that drops the work makes the job placeable there: the cycle sees the changed row
    await submit(h, "cmd", None)
    assert await h.run_cycle() == 1
    assert await nodes_of(rt) == {"bare": ["legacy"], "cmd": ["legacy"]}
