from __future__ import annotations

import statistics

import pytest

from services.agent.nvml_sim import GPU_SPECS, SimulatedNvml
from services.agent.nvml_types import NvmlBackend

H100x8 = ["H100-80GB"] * 8


def make(clock, models=None, *, seed=7, hostname="gpu-node-1"):
    sim = SimulatedNvml(hostname, models or H100x8, seed=seed, clock=clock)
    sim.open()
    return sim


def run(sim, clock, seconds, step=5.0):
    """Sample every ``step`` seconds for ``seconds``; returns the list of rounds."""
    rounds = []
    for _ in range(int(seconds / step)):
        clock.advance(step)
        rounds.append(sim.sample())
    return rounds


def uuid_of(sim, index):
    return sim.node_info().gpus[index].uuid


def test_simulated_backend_satisfies_the_backend_protocol(clock):
    assert isinstance(make(clock), NvmlBackend)


def test_free_gpu_reports_no_utilization_and_no_memory(clock):
    sim = make(clock)
    free = run(sim, clock, 120)[-1][0]
    assert free.utilization_gpu_pct == 0.0 and free.memory_used_mib == 0 and free.process_count == 0
    assert free.health == "healthy" and "gpu_idle" in free.throttle_reasons
    assert free.sm_clock_mhz == GPU_SPECS["H100-80GB"].idle_sm_clock_mhz


def test_training_workload_drives_utilization_high_and_heats_the_gpu(clock):
    sim = make(clock)
    sim.set_workload(uuid_of(sim, 0), "training")
    start_temp = sim.sample()[0].temperature_c
    rounds = run(sim, clock, 100)
    steady = [r[0] for r in rounds[6:]]  # past the ~20 s start-up; first dip is >= 120 s in
    assert all(85 <= s.utilization_gpu_pct <= 100 for s in steady)
    assert steady[-1].memory_used_mib > 0.85 * 81559
    assert steady[-1].power_w > 550
    assert steady[-1].temperature_c > start_temp + 25
    assert steady[-1].sm_clock_mhz > 1800
    assert rounds[-1][1].utilization_gpu_pct == 0.0  # the neighbour stays free and cool
    assert rounds[-1][1].temperature_c < start_temp + 3


def test_memory_ramps_up_over_seconds_not_instantly(clock):
    sim = make(clock)
    sim.set_workload(uuid_of(sim, 0), "training")
    used = [r[0].memory_used_mib for r in run(sim, clock, 20, step=1.0)]
    assert 0 < used[0] < 0.1 * 81559
    assert used == sorted(used)
    assert used[-1] > 0.85 * 81559


def test_training_has_periodic_checkpoint_dips(clock):
    sim = make(clock)
    sim.set_workload(uuid_of(sim, 0), "training")
    utils = [r[0].utilization_gpu_pct for r in run(sim, clock, 3600, step=5.0)[6:]]
    dips = [u for u in utils if u < 40]
    assert dips, "expected checkpoint/eval dips within an hour"
    assert len(dips) < 0.15 * len(utils)
    assert statistics.median(utils) > 88


def test_idle_allocation_holds_a_little_memory_but_no_compute(clock):
    sim = make(clock)
    sim.set_workload(uuid_of(sim, 0), "idle")
    s = run(sim, clock, 60)[-1][0]
    assert s.utilization_gpu_pct == 0.0
    assert 256 <= s.memory_used_mib <= 2048
    assert s.process_count == 1


def test_dev_workload_is_mostly_idle_with_short_bursts(clock):
    sim = make(clock)
    sim.set_workload(uuid_of(sim, 0), "dev")
    utils = [r[0].utilization_gpu_pct for r in run(sim, clock, 4 * 3600, step=10.0)]
    assert statistics.median(utils) < 5
    assert max(utils) > 50
    assert sum(u > 50 for u in utils) < 0.2 * len(utils)


def test_inference_is_busier_in_the_afternoon_than_at_night(clock):
    sim = make(clock)
    sim.set_workload(uuid_of(sim, 0), "inference")
    clock.now = 2 * 3600.0  # 02:00
    night = [r[0].utilization_gpu_pct for r in run(sim, clock, 1800, step=10.0)]
    clock.now = 15 * 3600.0  # 15:00
    afternoon = [r[0].utilization_gpu_pct for r in run(sim, clock, 1800, step=10.0)]
    assert statistics.mean(afternoon) > statistics.mean(night) + 25
    assert statistics.pstdev(afternoon) > 5  # bursty and noisy, not a flat line


def test_same_seed_and_clock_give_identical_samples(clock_factory):
    def trace(seed):
        c = clock_factory()
        sim = make(c, seed=seed)
        for i, kind in enumerate(["training", "inference", "dev", "idle"]):
            sim.set_workload(uuid_of(sim, i), kind)
        sim.inject_fault(5, "sbe_storm")
        return run(sim, c, 300)

    assert trace(3) == trace(3)
    assert trace(3) != trace(4)


def test_eight_gpu_h100_node_is_nvswitch_all_to_all_and_split_across_two_numa_nodes(clock):
    gpus = make(clock).node_info().gpus
    for g in gpus:
        assert g.nvlink_peers == tuple(i for i in range(8) if i != g.index)
    assert [g.numa_node for g in gpus] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert len({g.pci_bus_id for g in gpus}) == 8
    assert gpus[0].name == "NVIDIA H100 80GB HBM3" and gpus[0].model == "H100-80GB"


def test_pcie_models_have_no_nvlink_peers(clock):
    for model in ("L40S", "T4"):
        gpus = make(clock, [model] * 4).node_info().gpus
        assert all(g.nvlink_peers == () for g in gpus)
        assert [g.numa_node for g in gpus] == [0, 0, 1, 1]


def test_uuids_look_real_and_are_stable_per_hostname_and_index(clock):
    a = [g.uuid for g in make(clock, seed=1).node_info().gpus]
    again = [g.uuid for g in make(clock, seed=2).node_info().gpus]
    other_host = [g.uuid for g in make(clock, hostname="gpu-node-2").node_info().gpus]
    assert a == again
    assert set(a).isdisjoint(other_host)
    assert all(u.startswith("GPU-") and len(u) == 40 for u in a)


def test_xid79_marks_gpu_failed_and_stops_reporting_utilization(clock):
    sim = make(clock)
    sim.set_workload(uuid_of(sim, 3), "training")
    run(sim, clock, 60)
    sim.inject_fault(3, "xid79")
    clock.advance(5)
    first = sim.sample()[3]
    assert first.xid_events == (79,)
    assert first.health == "failed" and "gpu_lost" in first.health_reasons
    assert first.utilization_gpu_pct == 0.0 and first.memory_used_mib == 0
    assert first.temperature_c is None and first.power_w is None
    later = run(sim, clock, 30)[-1]
    assert later[3].xid_events == () and later[3].health == "failed"
    assert all(s.health == "healthy" for s in later if s.index != 3)


def test_double_bit_ecc_fault_fails_the_gpu_and_reports_xid48_once(clock):
    sim = make(clock)
    sim.inject_fault(2, "dbe")
    rounds = run(sim, clock, 20)
    assert rounds[0][2].xid_events == (48,)
    assert rounds[0][2].ecc_volatile_dbe == 1 and rounds[0][2].retired_pages_pending
    assert all(r[2].health == "failed" for r in rounds)
    assert all(r[2].xid_events == () for r in rounds[1:])


def test_sbe_storm_raises_the_sbe_count_and_degrades_the_gpu(clock):
    sim = make(clock)
    sim.inject_fault(1, "sbe_storm")
    rounds = run(sim, clock, 180)
    counts = [r[1].ecc_volatile_sbe for r in rounds]
    assert counts == sorted(counts) and counts[-1] >= 60
    assert rounds[-1][1].health == "degraded"
    assert any(reason.startswith("sbe_storm:") for reason in rounds[-1][1].health_reasons)
    assert rounds[-1][1].ecc_volatile_dbe == 0


def test_thermal_fault_heats_past_slowdown_throttles_clocks_and_degrades(clock):
    sim = make(clock)
    sim.set_workload(uuid_of(sim, 4), "training")
    before = run(sim, clock, 60)[-1][4]
    assert before.health == "healthy"
    sim.inject_fault(4, "thermal")
    after = run(sim, clock, 240)[-1][4]
    assert after.temperature_c >= GPU_SPECS["H100-80GB"].slowdown_temp_c
    assert "hw_thermal_slowdown" in after.throttle_reasons
    assert after.sm_clock_mhz < 0.7 * before.sm_clock_mhz
    assert after.health == "degraded"


def test_xid13_is_reported_once_and_the_gpu_stays_healthy(clock):
    sim = make(clock)
    sim.inject_fault(0, "xid13")
    rounds = run(sim, clock, 15)
    assert [r[0].xid_events for r in rounds] == [(13,), (), ()]
    assert all(r[0].health == "healthy" for r in rounds)


def test_clear_faults_restores_health(clock):
    sim = make(clock)
    sim.inject_fault(6, "xid79")
    sim.inject_fault(7, "dbe")
    assert {s.health for s in run(sim, clock, 10)[-1][6:]} == {"failed"}
    sim.clear_faults(6)
    sim.clear_faults(7)
    cleared = run(sim, clock, 10)[-1]
    assert (cleared[6].health, cleared[7].health) == ("healthy", "healthy")
    assert cleared[7].ecc_volatile_dbe == 0 and not cleared[7].retired_pages_pending


def test_mig_layout_places_instances_and_rejects_overfull_layouts(clock):
    sim = make(clock)
    sim.set_mig_layout(0, ["3g.40gb", "2g.20gb", "1g.10gb"])
    gpu = sim.node_info().gpus[0]
    assert gpu.mig_mode is True
    assert [(m.profile, m.start, m.size) for m in gpu.mig_instances] == [
        ("3g.40gb", 0, 4),
        ("2g.20gb", 4, 2),
        ("1g.10gb", 6, 1),
    ]
    assert all(m.uuid.startswith("MIG-") for m in gpu.mig_instances)
    assert sim.sample()[0].utilization_gpu_pct is None  # NVML has no whole-GPU util under MIG
    with pytest.raises(ValueError, match="does not fit"):
        sim.set_mig_layout(1, ["7g.80gb", "1g.10gb"])
    with pytest.raises(ValueError, match="does not support MIG"):
        make(clock, ["L40S"]).set_mig_layout(0, ["1g.10gb"])
    sim.set_mig_layout(0, [])
    assert sim.node_info().gpus[0].mig_mode is False


def test_unknown_workloads_faults_and_models_are_rejected(clock):
    sim = make(clock)
    with pytest.raises(ValueError):
        sim.set_workload(uuid_of(sim, 0), "mining")
    with pytest.raises(ValueError):
        sim.inject_fault(0, "xid999")
    with pytest.raises(KeyError):
        sim.set_workload("GPU-nope", "training")
    with pytest.raises(ValueError):
        SimulatedNvml("h", ["Z9000"], seed=1, clock=clock)


def test_sampling_before_open_is_an_error(clock):
    sim = SimulatedNvml("h", ["T4"], seed=1, clock=clock)
    with pytest.raises(RuntimeError, match="not open"):
        sim.sample()


def test_an_xid_storm_reports_the_xid_on_every_sample_for_its_duration_then_stops(clock):
    sim = make(clock)
    sim.inject_fault(2, "xid_storm", seconds=20, xid=43)
    rounds = run(sim, clock, 40)  # samples at +5 .. +40 s
    assert [r[2].xid_events for r in rounds] == [(43,)] * 3 + [()] * 5
    assert all(r[2].health == "healthy" for r in rounds)  # an application-level Xid is not latched
    assert all(r[1].xid_events == () for r in rounds)


def test_an_ecc_burst_raises_the_correctable_count_once(clock):
    sim = make(clock)
    before = sim.sample()[4].ecc_volatile_sbe
    sim.inject_fault(4, "ecc_burst", count=25)
    counts = [r[4].ecc_volatile_sbe for r in run(sim, clock, 30)]
    assert counts == [before + 25] * 6


def test_off_bus_and_ecc_storm_are_the_same_faults_as_xid79_and_sbe_storm(clock):
    sim = make(clock)
    sim.inject_fault(0, "off_bus")
    sim.inject_fault(1, "ecc_storm")
    last = run(sim, clock, 120)[-1]
    assert last[0].health == "failed" and "gpu_lost" in last[0].health_reasons
    assert any(r.startswith("sbe_storm:") for r in last[1].health_reasons)


def test_a_reset_fault_clears_a_gpu_that_fell_off_the_bus(clock):
    sim = make(clock)
    sim.inject_fault(3, "xid79")
    assert run(sim, clock, 10)[-1][3].health == "failed"
    sim.inject_fault(3, "reset")
    assert run(sim, clock, 10)[-1][3].health == "healthy"


def test_a_rogue_process_runs_on_a_free_gpu_and_no_process_empties_a_busy_one(clock):
    sim = make(clock)
    sim.set_workload(uuid_of(sim, 1), "training")
    sim.inject_fault(0, "rogue_process")
    busy = run(sim, clock, 30)[-1]
    assert busy[0].process_count >= 1 and busy[0].utilization_gpu_pct > 0
    assert busy[1].process_count >= 1
    sim.inject_fault(1, "no_process")
    assert run(sim, clock, 10)[-1][1].process_count == 0


def test_an_unknown_fault_is_refused(clock):
    with pytest.raises(ValueError):
        make(clock).inject_fault(0, "meltdown")
