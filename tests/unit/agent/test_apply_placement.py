"""What the agent decides to apply on its node (pure domain), and both backends doing it: MIG instances created and
destroyed at the planned slot, processes read with their memory and allocation, and stopped."""

from __future__ import annotations

import signal

import pynvml
import pytest

from libs.contracts.events import AllocatedGpu
from services.agent.domain import (
    LiveAllocation,
    MigBlocked,
    MigStep,
    fraction_violations,
    plan_mig,
    share_limits,
    wanted_mig,
)
from services.agent.nvml_real import RealNvml, allocation_from_environ
from services.agent.nvml_sim import SimulatedNvml
from services.agent.nvml_types import GpuProcess, MigError, MigInstance


def alloc(allocation_id: str, *gpus: AllocatedGpu, kind: str = "inference") -> LiveAllocation:
    return LiveAllocation(allocation_id, f"job-{allocation_id}", "research", "p", kind, tuple(gpus))


def mig_gpu(profile: str, start: int, index: int = 0) -> AllocatedGpu:
    return AllocatedGpu(uuid=f"GPU-{index}", index=index, model="A100-80GB", share_milli=428, mig_profile=profile,
                        mig_start=start)


def inst(profile: str, start: int, size: int, uuid: str) -> MigInstance:
    return MigInstance(profile=profile, start=start, size=size, uuid=uuid)


# --- convergence (pure) -------------------------------------------------------------------------------------------

def test_missing_instances_are_created_and_instances_nobody_holds_are_destroyed_first() -> None:
    live = [alloc("a", mig_gpu("3g.40gb", 4)), alloc("b", mig_gpu("1g.10gb", 0))]
    layout = {0: (inst("1g.10gb", 0, 1, "MIG-b"), inst("2g.20gb", 2, 2, "MIG-old"))}
    plan = plan_mig(wanted_mig(live), layout, [])
    assert plan.steps == (MigStep("destroy", 0, "2g.20gb", 2, None), MigStep("create", 0, "3g.40gb", 4, "a"))
    assert plan.present == {"b": layout[0][0]} and plan.blocked == ()


def test_applying_a_plan_and_planning_again_changes_nothing() -> None:
    live = [alloc("a", mig_gpu("3g.40gb", 4)), alloc("b", mig_gpu("1g.10gb", 0))]
    applied = {0: (inst("1g.10gb", 0, 1, "MIG-b"), inst("3g.40gb", 4, 4, "MIG-a"))}
    plan = plan_mig(wanted_mig(live), applied, [])
    assert plan.steps == () and plan.blocked == () and set(plan.present) == {"a", "b"}
    # nothing live, nothing there: nothing to do
    assert plan_mig([], {0: ()}, []).steps == ()


def test_an_instance_with_processes_is_never_destroyed_and_its_slots_stay_taken() -> None:
    live = [alloc("new", mig_gpu("3g.40gb", 4))]
    layout = {0: (inst("1g.10gb", 0, 1, "MIG-idle"), inst("4g.40gb", 4, 4, "MIG-busy"))}
    busy = GpuProcess(pid=7, gpu_uuid="GPU-0", gpu_index=0, used_memory_mib=100, mig_uuid="MIG-busy")
    plan = plan_mig(wanted_mig(live), layout, [busy])
    assert plan.steps == (MigStep("destroy", 0, "1g.10gb", 0, None),)
    assert set(plan.blocked) == {MigBlocked(None, 0, "4g.40gb", 4, "InstanceBusy"),
                                 MigBlocked("new", 0, "3g.40gb", 4, "SlotInUse")}


def test_a_gpu_with_a_process_outside_its_instances_is_not_reconfigured() -> None:
    live = [alloc("a", mig_gpu("1g.10gb", 6))]
    layout = {0: (inst("1g.10gb", 0, 1, "MIG-stale"),)}
    rogue = GpuProcess(pid=9, gpu_uuid="GPU-0", gpu_index=0, used_memory_mib=None, mig_uuid=None)
    plan = plan_mig(wanted_mig(live), layout, [rogue])
    assert plan.steps == ()
    assert set(plan.blocked) == {MigBlocked(None, 0, "1g.10gb", 0, "ProcessesOutsideLayout"),
                                 MigBlocked("a", 0, "1g.10gb", 6, "ProcessesOutsideLayout")}


def test_a_gpu_not_in_mig_mode_is_never_switched_and_unknown_profiles_are_refused() -> None:
    live = [alloc("a", mig_gpu("1g.10gb", 0, index=0)),
            alloc("b", AllocatedGpu(uuid="GPU-1", index=1, model="A100-80GB", mig_profile="9g.99gb", mig_start=0))]
    plan = plan_mig(wanted_mig(live), {0: None, 1: ()}, [])
    assert plan.steps == ()
    assert set(plan.blocked) == {MigBlocked("a", 0, "1g.10gb", 0, "MigModeDisabled"),
                                 MigBlocked("b", 1, "9g.99gb", 0, "UnknownProfile")}


def test_only_fractions_with_a_memory_promise_are_watched_and_each_process_is_reported_once() -> None:
    frac = alloc("f", AllocatedGpu(uuid="GPU-0", index=0, model="L40S", share_milli=300, memory_mib=8192))
    whole = alloc("w", AllocatedGpu(uuid="GPU-1", index=1, model="L40S"))
    limits = share_limits([frac, whole, alloc("m", mig_gpu("1g.10gb", 0, index=2))])
    assert [(lim.allocation.allocation_id, lim.limit_mib) for lim in limits] == [("f", 8192)]

    def proc(pid: int, mib: int | None, allocation: str | None = "f", gpu: str = "GPU-0") -> GpuProcess:
        return GpuProcess(pid=pid, gpu_uuid=gpu, gpu_index=0, used_memory_mib=mib, allocation_id=allocation)

    procs = [proc(1, 8192), proc(2, 9000), proc(3, None), proc(4, 20_000, None), proc(5, 20_000, "w", "GPU-1"),
             proc(6, 9000, "f", "GPU-1")]
    assert [p.pid for _, p in fraction_violations(limits, procs, set())] == [2]
    assert fraction_violations(limits, procs, {("f", 2)}) == []


# --- simulated backend --------------------------------------------------------------------------------------------

def test_the_simulator_creates_and_destroys_instances_by_the_catalogue_and_refuses_what_nvml_would(clock) -> None:
    sim = SimulatedNvml("n", ["A100-80GB", "L40S"], seed=1, clock=clock, mig_mode=[0])
    sim.open()
    assert sim.mig_layout() == {0: (), 1: None}
    made = sim.create_mig_instance(0, "3g.40gb", 4)
    assert (made.profile, made.start, made.size) == ("3g.40gb", 4, 4) and made.uuid.startswith("MIG-")
    assert sim.node_info().gpus[0].mig_instances == (made,)
    for args, reason in [((0, "3g.40gb", 4), "InsufficientResources"), ((0, "3g.40gb", 2), "InvalidPlacement"),
                         ((0, "1g.5gb", 0), "UnknownProfile"), ((1, "1g.10gb", 0), "MigModeDisabled")]:
        with pytest.raises(MigError) as refused:
            sim.create_mig_instance(*args)
        assert refused.value.reason == reason
    pid = sim.start_allocation(sim.node_info().gpus[0].uuid, "a", "training", share_milli=428, limit_mib=40960,
                               mig_uuid=made.uuid)
    with pytest.raises(MigError) as busy:
        sim.destroy_mig_instance(0, 4)
    assert busy.value.reason == "InUse"
    sim.stop_process(pid)
    sim.destroy_mig_instance(0, 4)
    sim.destroy_mig_instance(0, 4)  # nothing there: not an error
    assert sim.mig_layout()[0] == ()


def test_simulated_fractions_run_their_own_processes_within_their_limit_until_a_memory_hog(clock) -> None:
    sim = SimulatedNvml("n", ["L40S"], seed=1, clock=clock)
    sim.open()
    gpu = sim.node_info().gpus[0].uuid
    a = sim.start_allocation(gpu, "a", "training", share_milli=500, limit_mib=20_000)
    b = sim.start_allocation(gpu, "b", "dev", share_milli=300, limit_mib=8_000)
    assert sim.start_allocation(gpu, "a", "training", share_milli=500, limit_mib=20_000) is None  # once only
    for _ in range(30):
        clock.advance(1)
        sample = sim.sample()[0]
    procs = {p.pid: p for p in sim.processes()}
    assert {procs[a].allocation_id, procs[b].allocation_id} == {"a", "b"}
    assert 0 < procs[a].used_memory_mib <= 20_000 and 0 < procs[b].used_memory_mib <= 8_000
    assert sample.process_count == 2 and sample.memory_used_mib >= procs[a].used_memory_mib
    sim.inject_fault(0, "memory_hog", factor=2.0)
    for _ in range(10):
        clock.advance(1)
        sim.sample()
    procs = {p.pid: p for p in sim.processes()}
    assert procs[b].used_memory_mib > 8_000 and procs[a].used_memory_mib > 20_000
    sim.stop_process(b)
    assert b not in {p.pid for p in sim.processes()}
    with pytest.raises(ProcessLookupError):
        sim.stop_process(b)
    sim.end_allocation("a")
    assert sim.processes() == []


# --- real backend against the fake NVML module ----------------------------------------------------------------

def real(fake, clock, **kwargs) -> RealNvml:  # type: ignore[no-untyped-def]
    backend = RealNvml(fake, clock=clock, hostname="h", cpu_count=8, memory_total_mib=1024, **kwargs)
    backend.open()
    return backend


def test_real_backend_creates_a_gpu_instance_at_the_planned_slot_then_its_compute_instance(
        fake_nvml_factory, fake_gpu_factory, clock) -> None:
    fake = fake_nvml_factory([fake_gpu_factory(uuid="GPU-mig", mig_enabled=True, pids=())])
    backend = real(fake, clock)
    made = backend.create_mig_instance(0, "3g.40gb", 4)
    assert made == MigInstance(profile="3g.40gb", start=4, size=4, uuid="MIG-GPU-mig-4")
    assert fake.mig_ops == [("create_gi", 0, 9, 4, 4),
                            ("ci_profile", 1, pynvml.NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE,
                             pynvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED),
                            ("create_ci", 1, 100 + pynvml.NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE)]
    assert backend.mig_layout() == {0: (made,)} and backend.node_info().gpus[0].mig_instances == (made,)
    one = backend.create_mig_instance(0, "1g.10gb", 1)
    assert fake.mig_ops[-3][2:] == (19, 1, 1) and one.start == 1
    with pytest.raises(MigError) as overlap:
        backend.create_mig_instance(0, "3g.40gb", 4)
    assert overlap.value.reason == "InsufficientResources"
    with pytest.raises(MigError) as misplaced:
        backend.create_mig_instance(0, "3g.40gb", 2)
    assert misplaced.value.reason == "InvalidPlacement"


def test_real_backend_destroys_compute_then_gpu_instance_and_rolls_back_a_half_made_one(
        fake_nvml_factory, fake_gpu_factory, clock) -> None:
    fake = fake_nvml_factory([fake_gpu_factory(uuid="GPU-mig", mig_enabled=True, pids=())])
    backend = real(fake, clock)
    backend.create_mig_instance(0, "2g.20gb", 2)
    fake.mig_ops.clear()
    backend.destroy_mig_instance(0, 2)
    assert fake.mig_ops == [("destroy_ci", 1), ("destroy_gi", 1)]
    assert backend.mig_layout() == {0: ()}
    fake.fail_ci_create = pynvml.NVMLError_InsufficientResources()
    with pytest.raises(MigError):
        backend.create_mig_instance(0, "2g.20gb", 2)
    assert fake.mig_ops[-2:] == [("create_ci", 1, 101), ("destroy_gi", 1)] and fake.gpus[0].mig == []


def test_real_backend_refuses_to_touch_a_busy_instance_or_a_gpu_not_in_mig_mode(
        fake_nvml_factory, fake_gpu_factory, clock) -> None:
    busy = {"uuid": "MIG-x", "gi_id": 1, "profile_id": 19, "start": 0, "size": 1, "pids": {77: 500}}
    fake = fake_nvml_factory([fake_gpu_factory(uuid="GPU-mig", mig_enabled=True, mig=[busy], pids=()),
                              fake_gpu_factory(uuid="GPU-plain", bus_id="00000000:2a:00.0")])
    backend = real(fake, clock)
    with pytest.raises(MigError) as in_use:
        backend.destroy_mig_instance(0, 0)
    assert in_use.value.reason == "InUse"
    with pytest.raises(MigError) as off:
        backend.create_mig_instance(1, "1g.10gb", 0)
    assert off.value.reason == "MigModeDisabled" and backend.mig_layout()[1] is None


def test_real_backend_reads_process_memory_and_the_allocation_from_its_environment(
        fake_nvml_factory, fake_gpu_factory, clock) -> None:
    environ = {101: b"PATH=/bin\0GPUPOOL_ALLOCATION_ID=alloc-1\0HOME=/root\0", 102: b"PATH=/bin\0"}
    in_mig = {"uuid": "MIG-x", "gi_id": 1, "profile_id": 19, "start": 0, "size": 1, "pids": {103: 700}}

    def read_bytes(path: str) -> bytes:
        pid = int(path.split("/")[2])
        if pid not in environ:
            raise PermissionError(path)
        return environ[pid]

    fake = fake_nvml_factory([
        fake_gpu_factory(uuid="GPU-a", pids=(101, 102), proc_mem_mib={101: 9000}),
        fake_gpu_factory(uuid="GPU-b", bus_id="00000000:2a:00.0", mig_enabled=True, mig=[in_mig], pids=()),
    ])
    backend = real(fake, clock, read_bytes=read_bytes, proc_root="/proc")
    assert backend.processes() == [
        GpuProcess(pid=101, gpu_uuid="GPU-a", gpu_index=0, used_memory_mib=9000, allocation_id="alloc-1"),
        GpuProcess(pid=102, gpu_uuid="GPU-a", gpu_index=0, used_memory_mib=None, allocation_id=None),
        GpuProcess(pid=103, gpu_uuid="GPU-b", gpu_index=1, used_memory_mib=700, mig_uuid="MIG-x"),
    ]
    assert allocation_from_environ(b"A=1\0GPUPOOL_ALLOCATION_ID=\0") is None


def test_real_backend_stops_a_process_with_sigterm_then_sigkill(fake_nvml_factory, fake_gpu_factory, clock) -> None:
    sent: list[tuple[int, int]] = []
    backend = real(fake_nvml_factory([fake_gpu_factory(uuid="GPU-a")]), clock,
                   kill=lambda pid, sig: sent.append((pid, sig)))
    backend.stop_process(4242)
    backend.stop_process(4242, force=True)
    assert sent == [(4242, signal.SIGTERM), (4242, signal.SIGKILL)]
    with pytest.raises(ValueError):
        backend.stop_process(1)
