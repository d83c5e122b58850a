"""The node agent on the fake runtime's bus (libs/runtime/fake.py: FakeNats and FakeJetStream), with the simulated
NVML backend: registration answered by a served stand-in for inventory (refused, then retried until confirmed),
placement's allocation events through the agent's own subscription and router (a replay applied once, anything not
placement's or not for this node ignored), and telemetry published to JetStream or buffered while it is away. The
agent has no database and no outbox; against real NATS it is tested in tests/integration/test_agent*.py."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime
from typing import Any

import pytest

from libs.contracts import subjects
from libs.contracts.commands import RegisterNode, Reply
from libs.contracts.events import (
    AllocatedGpu,
    AllocationGranted,
    AllocationReleased,
    EventData,
    MigApplied,
    subject_for,
)
from libs.runtime.fake import FakeRuntime
from services.agent.domain import Deadband
from services.agent.handlers import NodeAgent, allocation_route, route
from services.agent.nvml_sim import SimulatedNvml

T0 = datetime(2026, 1, 1, tzinfo=UTC)


@pytest.fixture
async def agent(clock) -> tuple[FakeRuntime, NodeAgent, SimulatedNvml]:  # type: ignore[no-untyped-def]
    rt = FakeRuntime("agent")
    backend = SimulatedNvml("n0", ["A100-80GB", "A100-80GB"], seed=3, clock=clock, mig_mode=[0])
    backend.open()
    node = NodeAgent(rt.nc, backend, "c1", "n0", 1.0)  # type: ignore[arg-type]
    node.synced = True
    # the agent's routing, as NodeAgent.run subscribes it
    await route(rt.nc, subjects.ALLOCATION_ALL, allocation_route, ("c1", "n0"), node.apply_allocation)
    return rt, node, backend


async def placement_publishes(rt: FakeRuntime, data: EventData, *, source: str = "/gpupool/placement",
                              subject: str | None = None, event_id: str | None = None) -> None:
    event = data.to_cloudevent(source, **({"event_id": event_id} if event_id else {}))
    await rt.nc.publish(subject or subject_for(data), event.to_json())


def mig_grant(backend: SimulatedNvml, allocation_id: str = "a1", node: str = "n0") -> AllocationGranted:
    gpu = AllocatedGpu(uuid=backend.node_info().gpus[0].uuid, index=0, model="A100-80GB", share_milli=428,
                       mig_profile="3g.40gb", mig_start=4)
    return AllocationGranted(allocation_id=allocation_id, job_id="j1", team="research", project="default",
                             cluster="c1", node=node, gpus=[gpu], granted_at=T0)


def stored(rt: FakeRuntime, kind: type[EventData]) -> list[dict[str, Any]]:
    docs = [json.loads(payload) for _, payload, _ in rt.nc.js.published]
    return [d["data"] for d in docs if d.get("type") == kind.event_type]


async def test_registration_is_retried_until_inventory_confirms_it(agent) -> None:  # type: ignore[no-untyped-def]
    rt, node, _ = agent
    asked: list[RegisterNode] = []

    async def inventory(cmd: RegisterNode) -> Reply:
        asked.append(cmd)
        return Reply.failure(503, "Busy", "try again") if len(asked) == 1 else Reply.success({"node": cmd.node})
    await rt.serve(f"{subjects.CMD_INVENTORY_REGISTER_NODE}.*.*", RegisterNode, inventory)
    await asyncio.wait_for(node.register(asyncio.Event()), timeout=5)
    assert len(asked) == 2 and rt.nc.requests[-1][0] == subjects.register_node("c1", "n0")
    assert [(g.index, g.model) for g in asked[-1].gpus] == [(0, "A100-80GB"), (1, "A100-80GB")]


async def test_a_grant_creates_its_mig_instance_once_however_often_it_arrives(agent) -> None:  # type: ignore[no-untyped-def]
    rt, node, backend = agent
    grant = mig_grant(backend)
    await placement_publishes(rt, grant, event_id="e1")
    await placement_publishes(rt, grant, event_id="e1")  # a redelivery
    [instance] = backend.mig_layout()[0]
    assert (instance.profile, instance.start) == ("3g.40gb", 4) and set(node.live) == {"a1"}
    assert [d["action"] for d in stored(rt, MigApplied)] == ["created"]

    await placement_publishes(rt, AllocationReleased(**grant.model_dump(exclude={"kind", "priority_class",
        "max_runtime_s", "environment", "work", "attempt"}), released_at=T0, reason="JobCompleted"))
    await placement_publishes(rt, grant)  # a late copy of the grant does not revive it
    assert backend.mig_layout()[0] == () and node.live == {}
    assert [d["action"] for d in stored(rt, MigApplied)] == ["created", "destroyed"]


async def test_what_is_not_placements_or_not_for_this_node_is_ignored(agent) -> None:  # type: ignore[no-untyped-def]
    rt, node, backend = agent
    await placement_publishes(rt, mig_grant(backend, node="n1"))  # another node's
    await placement_publishes(rt, mig_grant(backend), source="/gpupool/queue")  # not from placement
    await placement_publishes(rt, mig_grant(backend), subject=subjects.ALLOCATION_RELEASED)  # not its subject
    await rt.nc.publish(subjects.ALLOCATION_GRANTED, b"{not json")
    assert node.live == {} and backend.mig_layout()[0] == () and rt.nc.js.published == []


async def test_telemetry_goes_to_jetstream_and_waits_in_the_buffer_while_it_is_away(agent) -> None:  # type: ignore[no-untyped-def]
    rt, node, _ = agent
    await node.sample_once()
    [(subject, payload, headers)] = rt.nc.js.published
    assert subject == subjects.telemetry("c1", "n0") and node.samples_sent == 1
    assert headers["Nats-Msg-Id"] == json.loads(payload)["id"]
    rt.nc.js.down = True
    await node.sample_once()
    assert node.samples_sent == 1 and len(node.buffer) == 1 and len(rt.nc.js.published) == 1


async def test_sampling_by_change_sends_only_moved_gpus_and_every_gpu_at_the_heartbeat(  # type: ignore[no-untyped-def]
        agent, clock, monkeypatch) -> None:
    rt, node, backend = agent
    node.deadband = Deadband(heartbeat_s=5.0)
    now = [1_000.0]
    monkeypatch.setattr("services.agent.handlers.time.time", lambda: now[0])
    free, busy = (g.uuid for g in backend.node_info().gpus)

    async def tick() -> list[str]:
        before = len(rt.nc.js.published)
        now[0] += 1.0
        clock.advance(1.0)
        await node.sample_once()
        docs = [json.loads(p)["data"] for _, p, _ in rt.nc.js.published[before:]]
        assert all((d["interval_s"], d["heartbeat_s"]) == (1.0, 5.0) for d in docs)
        return [g["uuid"] for d in docs for g in d["gpus"]]

    assert await tick() == [free, busy]  # the first sample: every GPU
    for _ in range(2):
        assert await tick() == []  # both idle and steady: nothing on the bus
    backend.set_workload(busy, "training")  # its memory ramps at once, its utilisation rises
    assert await tick() == [busy]
    assert free not in await tick()  # still idle: not sent until its heartbeat...
    assert await tick() == [free, busy]  # ... the 5th second after the last whole sample: every GPU goes
