"""The node agent's loop logic on the simulated backend, events captured where they would be published: it follows
grants and releases, converges MIG instances (never destroying before it knows what is live), and enforces fraction
limits by policy, once per process."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from types import SimpleNamespace

from libs.contracts.events import (
    AllocatedGpu,
    AllocationGranted,
    AllocationReleased,
    EventData,
    FractionExceeded,
    GpuSharingSet,
    MigApplied,
    subject_for,
)
from services.agent.config import AgentSettings
from services.agent.handlers import NodeAgent
from services.agent.nvml_sim import SimulatedNvml

T0 = datetime(2026, 1, 1, tzinfo=UTC)


class CapturingAgent(NodeAgent):
    def __init__(self, backend: SimulatedNvml, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(SimpleNamespace(jetstream=lambda: None), backend, "local", "n0", 1.0, **kwargs)
        self.published: list[EventData] = []

    async def _publish(self, data: EventData, identity: str) -> bool:
        self.published.append(data)
        return True


class Msg:
    def __init__(self, data: EventData) -> None:
        self.data = data.to_cloudevent("/gpupool/placement").model_dump_json().encode()
        self.subject = subject_for(data)  # where placement publishes it (the agent checks)
        self.headers: dict[str, str] | None = None  # as a NATS message without headers


def grant(allocation_id: str, gpu: AllocatedGpu, kind: str = "training") -> Msg:
    return Msg(AllocationGranted(allocation_id=allocation_id, job_id=f"job-{allocation_id}", team="t", project="p",
                                 cluster="local", node="n0", gpus=[gpu], granted_at=T0, kind=kind))


def release(allocation_id: str, gpu: AllocatedGpu) -> Msg:
    return Msg(AllocationReleased(allocation_id=allocation_id, job_id=f"job-{allocation_id}", team="t", project="p",
                                  cluster="local", node="n0", gpus=[gpu], granted_at=T0, released_at=T0,
                                  reason="JobCompleted"))


def sim(clock, models, **kwargs) -> SimulatedNvml:  # type: ignore[no-untyped-def]
    backend = SimulatedNvml("n0", models, seed=3, clock=clock, **kwargs)
    backend.open()
    return backend


async def test_a_mig_grant_creates_its_instance_once_and_its_release_destroys_it(clock) -> None:
    backend = sim(clock, ["A100-80GB"], mig_mode=[0])
    agent = CapturingAgent(backend)
    agent.synced = True
    gpu = AllocatedGpu(uuid=backend.node_info().gpus[0].uuid, index=0, model="A100-80GB", share_milli=428,
                       mig_profile="3g.40gb", mig_start=4)
    await agent._on_allocation(grant("a", gpu))
    await agent._on_allocation(grant("a", gpu))  # a replay changes nothing
    [inst] = backend.mig_layout()[0]
    assert (inst.profile, inst.start) == ("3g.40gb", 4)
    created = [e for e in agent.published if isinstance(e, MigApplied)]
    assert [(e.action, e.mig_uuid, e.start) for e in created] == [("created", inst.uuid, 4)]
    assert any(p.mig_uuid == inst.uuid and p.allocation_id == "a" for p in backend.processes())
    await agent._on_allocation(release("a", gpu))
    assert backend.mig_layout()[0] == ()
    assert [e.action for e in agent.published if isinstance(e, MigApplied)] == ["created", "destroyed"]


async def test_before_the_start_up_query_answered_no_instance_is_destroyed(clock) -> None:
    backend = sim(clock, ["A100-80GB"], mig_mode=[0])
    backend.create_mig_instance(0, "1g.10gb", 0)  # from an allocation the agent has not heard of yet
    agent = CapturingAgent(backend)
    await agent.converge()
    assert len(backend.mig_layout()[0]) == 1 and agent.converge_pending
    agent.synced = True
    await agent.converge()
    assert backend.mig_layout()[0] == () and not agent.converge_pending


async def test_a_mig_grant_on_a_gpu_not_in_mig_mode_is_reported_failed_once(clock) -> None:
    backend = sim(clock, ["A100-80GB"])
    agent = CapturingAgent(backend)
    gpu = AllocatedGpu(uuid=backend.node_info().gpus[0].uuid, index=0, model="A100-80GB", share_milli=142,
                       mig_profile="1g.10gb", mig_start=0)
    await agent._on_allocation(grant("a", gpu))
    await agent.converge()
    failed = [e for e in agent.published if isinstance(e, MigApplied)]
    assert [(e.action, e.reason) for e in failed] == [("failed", "MigModeDisabled")]
    assert backend.mig_layout()[0] is None and agent.converge_pending


async def grown_fraction(clock, policy: str, kind: str = "training") -> tuple[CapturingAgent, SimulatedNvml]:  # type: ignore[no-untyped-def]
    backend = sim(clock, ["L40S"])
    agent = CapturingAgent(backend, fraction_policy=policy, stop_grace_s=5)
    gpu = AllocatedGpu(uuid=backend.node_info().gpus[0].uuid, index=0, model="L40S", share_milli=300,
                       memory_mib=8192)
    await agent._on_allocation(grant("f", gpu, kind))
    for _ in range(20):
        clock.advance(1)
        backend.sample()
        await agent.enforce()
    assert not [e for e in agent.published if isinstance(e, FractionExceeded)]  # inside its limit
    backend.inject_fault(0, "memory_hog", factor=2)
    for _ in range(10):
        clock.advance(1)
        backend.sample()
        await agent.enforce()
    return agent, backend


async def test_policy_report_reports_an_overgrown_process_once_and_leaves_it_running(clock) -> None:
    agent, backend = await grown_fraction(clock, "report")
    [event] = [e for e in agent.published if isinstance(e, FractionExceeded)]
    assert (event.allocation_id, event.limit_mib, event.action) == ("f", 8192, "reported") and event.used_mib > 8192
    assert [p.pid for p in backend.processes()] == [event.pid]


async def test_policy_stop_stops_the_process_and_frees_its_memory(clock) -> None:
    agent, backend = await grown_fraction(clock, "stop")
    [event] = [e for e in agent.published if isinstance(e, FractionExceeded)]
    assert event.action == "stopped"
    assert backend.processes() == [] and agent.stopping == {}


async def test_the_default_policy_stops_dev_work_and_reports_the_rest(clock) -> None:
    """Issue #17: `stop` is the default for dev work (an interactive session must not squeeze its neighbours)."""
    agent, backend = await grown_fraction(clock, "auto", kind="dev")
    [event] = [e for e in agent.published if isinstance(e, FractionExceeded)]
    assert event.action == "stopped" and backend.processes() == []
    agent, backend = await grown_fraction(clock, "auto", kind="inference")
    [event] = [e for e in agent.published if isinstance(e, FractionExceeded)]
    assert event.action == "reported" and [p.pid for p in backend.processes()] == [event.pid]
    assert AgentSettings().fraction_policy == "auto"


async def test_a_fraction_running_its_jobs_work_stops_that_work_not_just_a_process(clock) -> None:
    """The job's own work over its fraction: the work runner stops all of it (it then ends failed
    FractionMemoryExceeded and the allocation is released) instead of the agent killing one process."""
    stops: list[tuple] = []

    class Work:
        executor = SimpleNamespace(running=lambda: {})  # no cgroup owners: the process says its allocation

        def runs(self, allocation_id: str) -> bool:
            return True

        def on_granted(self, grant, mig_uuid=None) -> None:  # type: ignore[no-untyped-def]
            return None

        def launch_ready(self, mig_uuids) -> None:  # type: ignore[no-untyped-def]
            return None

        async def stop_over_fraction(self, *args) -> None:  # type: ignore[no-untyped-def]
            stops.append(args)

    backend = sim(clock, ["L40S"])
    agent = CapturingAgent(backend, fraction_policy="auto", stop_grace_s=5)
    agent.work = Work()  # type: ignore[assignment]
    gpu = AllocatedGpu(uuid=backend.node_info().gpus[0].uuid, index=0, model="L40S", share_milli=300,
                       memory_mib=8192)
    await agent._on_allocation(grant("f", gpu, "dev"))
    # a simulated process stands in for the work's own (the runner owns the real one)
    backend.start_allocation(gpu.uuid, "f", "dev", share_milli=300, limit_mib=8192)
    backend.inject_fault(0, "memory_hog", factor=2)
    for _ in range(12):
        clock.advance(1)
        backend.sample()
        await agent.enforce()
    [event] = [e for e in agent.published if isinstance(e, FractionExceeded)]
    assert event.action == "stopped"
    assert stops == [("f", event.pid, event.used_mib, 8192, 5)]
    assert agent.stopping == {}  # the runner stops it; the agent sends no signal of its own


async def test_a_process_that_ignores_sigterm_gets_sigkill_after_the_grace(clock, monkeypatch) -> None:
    import services.agent.handlers as handlers

    signals: list[tuple[int, bool]] = []

    class Stubborn(SimulatedNvml):
        def stop_process(self, pid: int, *, force: bool = False) -> None:
            signals.append((pid, force))
            if force:
                super().stop_process(pid, force=True)

    backend = Stubborn("n0", ["L40S"], seed=3, clock=clock)
    backend.open()
    agent = CapturingAgent(backend, fraction_policy="stop", stop_grace_s=5)
    monotonic = [100.0]
    monkeypatch.setattr(handlers.time, "monotonic", lambda: monotonic[0])
    gpu = AllocatedGpu(uuid=backend.node_info().gpus[0].uuid, index=0, model="L40S", share_milli=300,
                       memory_mib=8192)
    await agent._on_allocation(grant("f", gpu))
    backend.inject_fault(0, "memory_hog", factor=2)
    for _ in range(12):
        clock.advance(1)
        monotonic[0] += 1
        backend.sample()
        await agent.enforce()
    [event] = [e for e in agent.published if isinstance(e, FractionExceeded)]
    assert signals == [(event.pid, False), (event.pid, True)]
    assert backend.processes() == []


def test_a_node_may_publish_its_own_events_and_the_gateway_relays_every_event_entity(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from libs.contracts import subjects
    from libs.devstack.nats_auth import IdentityStore

    store = IdentityStore(tmp_path)
    node = store.node("local", "sim-node-0")
    users = {u.name: u for u in store.services()}
    for base in (subjects.AGENT_MIG_APPLIED, subjects.AGENT_FRACTION_EXCEEDED, subjects.AGENT_WORK_STARTED):
        own, other = subjects.of_node(base, "local", "sim-node-0"), subjects.of_node(base, "local", "sim-node-1")
        assert any(subjects.matches(p, own) for p in node.publish), own
        assert not any(subjects.matches(p, other) for p in node.publish), other
        assert not any(subjects.matches(p, own) for p in users["placement"].publish), own
        assert any(subjects.matches(s, own) for s in users["gateway"].subscribe), own
        assert any(subjects.matches(s, own) for s in subjects.EVENTS_STREAM.subjects), own
    for entity in subjects.EVENT_ENTITIES:  # GET /v1/events subscribes to each
        assert f"gpupool.{entity}.>" in users["gateway"].subscribe, entity


async def test_a_fleet_in_one_process_subscribes_once_per_subject_and_each_event_reaches_only_its_node(clock) -> None:
    from services.agent.handlers import allocation_route, fault_route, route

    class OneConnection:
        def __init__(self) -> None:
            self.subscriptions: dict[str, object] = {}

        async def subscribe(self, subject: str, cb) -> None:  # type: ignore[no-untyped-def]
            assert subject not in self.subscriptions, f"{subject} subscribed twice"
            self.subscriptions[subject] = cb

    nc = OneConnection()
    seen: dict[str, list[str]] = {"n0": [], "n1": []}
    for node in seen:
        async def on_event(data, node=node) -> None:  # type: ignore[no-untyped-def]
            seen[node].append(data.allocation_id)

        async def on_fault(doc, node=node) -> None:  # type: ignore[no-untyped-def]
            seen[node].append(doc["fault"])

        await route(nc, "gpupool.allocation.>", allocation_route, ("local", node), on_event)
        await route(nc, "gpupool.sim.fault", fault_route, node, on_fault)
    assert set(nc.subscriptions) == {"gpupool.allocation.>", "gpupool.sim.fault"}

    gpu = AllocatedGpu(uuid="GPU-x", index=0, model="H100-80GB")
    await nc.subscriptions["gpupool.allocation.>"](grant("a", gpu))  # for n0 (cluster local)
    await nc.subscriptions["gpupool.sim.fault"](SimpleNamespace(data=b'{"node": "n1", "gpu": 0, "fault": "xid13"}',
                                                                  subject="gpupool.sim.fault", headers=None))
    await nc.subscriptions["gpupool.sim.fault"](SimpleNamespace(data=b'{"node": "n7", "fault": "silence"}'))
    await nc.subscriptions["gpupool.sim.fault"](SimpleNamespace(data=b"not json"))
    assert seen == {"n0": ["a"], "n1": ["xid13"]}


def test_every_node_registers_where_its_peers_reach_it() -> None:
    """Issue #17: a gang's members rendezvous at their rank-0 node's address; simulated nodes get one each."""
    import pytest
    from pydantic import ValidationError

    from libs.contracts.addresses import peer_address
    from libs.contracts.commands import RegisterNode
    from services.agent.bootstrap import node_addresses
    from services.agent.domain import simulated_address

    assert [simulated_address(i) for i in (0, 1, 253, 254)] == ["127.0.0.2", "127.0.0.3", "127.0.0.255",
                                                                "127.0.1.0"]
    sim_settings = AgentSettings(backend="sim")
    assert node_addresses(sim_settings, ["a", "b"]) == {"a": "127.0.0.2", "b": "127.0.0.3"}
    assert node_addresses(AgentSettings(address="10.0.0.7"), ["gpu-1"]) == {"gpu-1": "10.0.0.7"}
    assert peer_address("fe80:0:0::1") == "fe80::1" and peer_address("gpu-1.rack-3.example") == "gpu-1.rack-3.example"
    for bad in ("10.0.0.7; rm -rf /", "-gpu", "a" * 254, "gpu_1", "1.2.3.4:80"):
        with pytest.raises(ValueError):
            peer_address(bad)
        with pytest.raises(ValidationError):
            RegisterNode(cluster="c", node="n", hostname="h", cpu_count=1, memory_mib=1, gpus=[], address=bad)
    with pytest.raises(ValidationError):
        AgentSettings(address="not an address")


def sharing(backend: SimulatedNvml, mode: str, draining_to: str | None = None) -> GpuSharingSet:
    g = backend.node_info().gpus[0]
    return GpuSharingSet(cluster="local", node="n0", gpu_uuid=g.uuid, gpu_index=0, mode=mode,
                         draining_to=draining_to, set_at=T0)


async def test_a_gpu_switched_to_mig_gets_mig_mode_once_its_instances_and_processes_are_gone(clock) -> None:
    backend = sim(clock, ["H100-80GB"])
    agent = CapturingAgent(backend)
    registered: list[bool] = []

    async def register(stop) -> None:  # type: ignore[no-untyped-def]
        registered.append(backend.node_info().gpus[0].mig_mode)

    agent.register = register  # type: ignore[method-assign]
    await agent.apply_sharing(sharing(backend, "exclusive", draining_to="mig"))  # still draining: left alone
    assert backend.mig_layout()[0] is None and not agent.mig_mode_wanted
    await agent.apply_sharing(sharing(backend, "mig"))
    await asyncio.sleep(0)  # the re-registration runs outside the subscription's callback
    assert backend.mig_layout()[0] == () and registered == [True]

    backend.create_mig_instance(0, "1g.10gb", 0)  # a slice's cleanup has not run yet when "exclusive" arrives
    await agent.apply_sharing(sharing(backend, "exclusive"))
    assert backend.node_info().gpus[0].mig_mode and agent.converge_pending
    backend.destroy_mig_instance(0, 0)
    agent.synced = True
    await agent.converge()
    await asyncio.sleep(0)
    assert backend.mig_layout()[0] is None and not agent.mig_mode_wanted and registered == [True, False]
