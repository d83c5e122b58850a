from __future__ import annotations

import pynvml
import pytest

from services.agent.gpu_names import (
    THROTTLE_REASON_BITS,
    canonical_model,
    normalize_pci_bus_id,
    throttle_reason_names,
)
from services.agent.nvml_real import RealNvml
from services.agent.nvml_types import GpuExtraReadings, MigInstance, NvmlBackend

HGX_BUS = ["00000000:18:00.0", "00000000:2A:00.0", "00000000:3A:00.0", "00000000:5D:00.0"]


@pytest.mark.parametrize(
    ("name", "memory_mib", "model"),
    [
        ("NVIDIA H100 80GB HBM3", 81559, "H100-80GB"),
        ("NVIDIA H100 PCIe", 81559, "H100-80GB"),
        ("NVIDIA H100 NVL", 95830, "H100-94GB"),
        ("NVIDIA H200", 143771, "H200-141GB"),
        ("NVIDIA A100-SXM4-40GB", 40960, "A100-40GB"),
        ("NVIDIA A100-SXM4-80GB", 81920, "A100-80GB"),
        ("NVIDIA A100 80GB PCIe", 81920, "A100-80GB"),
        ("NVIDIA L40S", 46068, "L40S"),
        ("NVIDIA L4", 23034, "L4"),
        ("Tesla T4", 15360, "T4"),
        ("Tesla V100-SXM2-32GB", 32768, "V100-32GB"),
        ("NVIDIA GH200 480GB", 97871, "GH200-480GB"),
        ("NVIDIA RTX 6000 Ada Generation", 49140, "RTX-6000-ADA-GENERATION-48GB"),
    ],
)
def test_canonical_model_maps_marketing_names_and_memory_to_short_models(name, memory_mib, model):
    assert canonical_model(name, memory_mib) == model


@pytest.mark.parametrize(
    ("raw", "normalised"),
    [
        ("00000000:1B:00.0", "0000:1b:00.0"),
        ("0000:DB:00.0", "0000:db:00.0"),
        (b"00000001:9A:00.0\x00", "0001:9a:00.0"),
        ("1b:00.0", "0000:1b:00.0"),
    ],
)
def test_pci_bus_ids_are_normalised_to_the_sysfs_form(raw, normalised):
    assert normalize_pci_bus_id(raw) == normalised


def test_a_malformed_pci_bus_id_is_rejected():
    with pytest.raises(ValueError):
        normalize_pci_bus_id("not-a-bus-id")


def test_throttle_reason_mask_decodes_to_names():
    mask = pynvml.nvmlClocksEventReasonSwPowerCap | pynvml.nvmlClocksEventReasonHwThermalSlowdown
    assert throttle_reason_names(mask) == ("sw_power_cap", "hw_thermal_slowdown")


def _backend(fake, clock, **kw):
    return RealNvml(fake, clock=clock, hostname="gpu-node-1", cpu_count=64, memory_total_mib=512_000, **kw)


def test_real_backend_reads_inventory_and_samples_from_nvml(fake_nvml_factory, fake_gpu_factory, clock):
    fake = fake_nvml_factory(
        [fake_gpu_factory(uuid="GPU-aaa"), fake_gpu_factory(uuid="GPU-bbb", bus_id=HGX_BUS[1], numa=1)]
    )
    backend = _backend(fake, clock)
    assert isinstance(backend, NvmlBackend)
    backend.open()

    node = backend.node_info()
    assert (node.hostname, node.driver_version, node.cuda_driver_version) == (
        "gpu-node-1",
        "550.90.07",
        "12.4",
    )
    assert (node.cpu_count, node.memory_total_mib) == (64, 512_000)
    gpu = node.gpus[1]
    assert gpu.uuid == "GPU-bbb" and gpu.index == 1
    assert gpu.model == "H100-80GB" and gpu.memory_total_mib == 81559
    assert gpu.pci_bus_id == "0000:2a:00.0" and gpu.numa_node == 1
    assert gpu.compute_capability == "9.0" and gpu.power_limit_w == 700.0
    assert gpu.slowdown_temp_c == 87.0 and gpu.serial == "1650000000001"
    assert gpu.mig_mode is False and gpu.mig_instances == () and gpu.nvlink_peers == ()

    samples = backend.sample()
    s = samples[0]
    assert s.timestamp == clock.now
    assert (s.utilization_gpu_pct, s.utilization_memory_pct) == (50.0, 20.0)
    assert (s.memory_used_mib, s.memory_total_mib) == (1024, 81559)
    assert (s.temperature_c, s.power_w, s.sm_clock_mhz) == (45.0, 300.0, 1980)
    assert s.process_count == 1 and s.xid_events == () and s.throttle_reasons == ()
    assert (s.health, s.health_reasons) == ("healthy", ())
    backend.close()
    assert fake.initialised is False


def test_real_backend_reads_the_extra_dcgm_fields_nvml_has(fake_nvml_factory, fake_gpu_factory, clock):
    fake = fake_nvml_factory([fake_gpu_factory(uuid="GPU-sxm", nvlink_kib=(5_000, 7_000)),
                              fake_gpu_factory(uuid="GPU-pcie", name="NVIDIA L40S", memory_total_mib=46068,
                                               memory_temp=0)])
    backend = _backend(fake, clock)
    backend.open()
    sxm, pcie = (s.extra for s in backend.sample())
    assert sxm == GpuExtraReadings(
        memory_clock_mhz=2619, memory_temperature_c=52.0, energy_mj=123_456_789, pcie_replay_count=3,
        encoder_util_pct=7.0, decoder_util_pct=11.0,
        fb_used_mib=1024 - 527, fb_free_mib=81559 - 1024, fb_reserved_mib=527,  # v2: used excludes reserved
        nvlink_data_kib=12_000, vgpu_license_status=None,
        correctable_remapped_rows=2, uncorrectable_remapped_rows=1, row_remap_failure=False,
        gr_engine_active=None, tensor_active=None, dram_active=None,  # DCGM's profiling: not read from NVML
        pcie_tx_bytes_per_s=2000 * 1024.0, pcie_rx_bytes_per_s=5000 * 1024.0)
    assert pcie.memory_temperature_c is None  # NVML's 0: the board has no memory sensor
    assert pcie.nvlink_data_kib is None  # the NVLink fields answer Not Supported on a PCIe card
    assert pcie.energy_mj == 123_456_789


def test_extra_dcgm_fields_nvml_cannot_read_are_absent_not_a_failed_sample(
        fake_nvml_factory, fake_gpu_factory, clock):
    unsupported = {"nvmlDeviceGetTotalEnergyConsumption", "nvmlDeviceGetPcieReplayCounter",
                   "nvmlDeviceGetEncoderUtilization", "nvmlDeviceGetDecoderUtilization",
                   "nvmlDeviceGetPcieThroughput", "nvmlDeviceGetFieldValues", "nvmlDeviceGetRemappedRows"}
    fake = fake_nvml_factory([fake_gpu_factory(uuid="GPU-old", not_supported=unsupported)])
    fake.nvmlMemory_v2 = None  # a binding without the v2 memory query
    backend = _backend(fake, clock)
    backend.open()
    s = backend.sample()[0]
    assert (s.health, s.temperature_c, s.memory_used_mib) == ("healthy", 45.0, 1024)
    assert s.extra == GpuExtraReadings(memory_clock_mhz=2619)


def test_real_backend_treats_not_supported_queries_as_missing(fake_nvml_factory, fake_gpu_factory, clock):
    unsupported = {
        "nvmlDeviceGetUtilizationRates",
        "nvmlDeviceGetTemperatureV",
        "nvmlDeviceGetPowerUsage",
        "nvmlDeviceGetTotalEccErrors",
        "nvmlDeviceGetRetiredPagesPendingStatus",
        "nvmlDeviceGetRemappedRows",
        "nvmlDeviceGetSerial",
        "nvmlDeviceGetEnforcedPowerLimit",
        "nvmlDeviceGetTemperatureThreshold",
        "nvmlDeviceGetMigMode",
        "nvmlDeviceGetCurrentClocksEventReasons",
        "nvmlDeviceGetComputeRunningProcesses",
        "nvmlDeviceGetSupportedEventTypes",
    }
    fake = fake_nvml_factory(
        [fake_gpu_factory(uuid="GPU-t4", name="Tesla T4", memory_total_mib=15360, not_supported=unsupported)]
    )
    # a function the binding does not have at all is "missing" too (older nvidia-ml-py)
    assert not hasattr(fake, "nvmlDeviceGetPowerManagementLimit")
    backend = _backend(fake, clock)
    backend.open()

    gpu = backend.node_info().gpus[0]
    assert gpu.model == "T4"
    assert (gpu.serial, gpu.power_limit_w, gpu.slowdown_temp_c, gpu.mig_mode) == (None, None, None, False)
    s = backend.sample()[0]
    assert s.utilization_gpu_pct is None and s.utilization_memory_pct is None
    assert s.power_w is None
    assert s.temperature_c == 45.0  # the unversioned temperature call is used as a fallback
    assert (s.ecc_volatile_sbe, s.ecc_volatile_dbe, s.retired_pages_pending) == (0, 0, False)
    assert s.throttle_reasons == () and s.process_count == 0
    assert s.health == "healthy"


def test_real_backend_falls_back_to_sysfs_for_numa_when_nvml_lacks_it(
    fake_nvml_factory, fake_gpu_factory, clock
):
    fake = fake_nvml_factory([fake_gpu_factory(uuid="GPU-a", bus_id="00000000:9A:00.0", numa=None)])
    files = {"/sys/bus/pci/devices/0000:9a:00.0/numa_node": "1\n"}
    backend = _backend(fake, clock, read_file=files.__getitem__)
    backend.open()
    assert backend.node_info().gpus[0].numa_node == 1


def test_numa_is_unknown_when_sysfs_reports_no_affinity(fake_nvml_factory, fake_gpu_factory, clock):
    fake = fake_nvml_factory([fake_gpu_factory(uuid="GPU-a", numa=None)])
    backend = _backend(fake, clock, read_file=lambda path: "-1\n")
    backend.open()
    assert backend.node_info().gpus[0].numa_node is None


def test_direct_nvlinks_are_mapped_back_to_local_gpu_indices(fake_nvml_factory, fake_gpu_factory, clock):
    gpus = [
        fake_gpu_factory(uuid="GPU-0", bus_id=HGX_BUS[0], nvlink_remote={0: HGX_BUS[1], 1: HGX_BUS[1]}),
        fake_gpu_factory(uuid="GPU-1", bus_id=HGX_BUS[1], nvlink_remote={0: HGX_BUS[0], 1: HGX_BUS[0]}),
        fake_gpu_factory(uuid="GPU-2", bus_id=HGX_BUS[2]),
    ]
    backend = _backend(fake_nvml_factory(gpus), clock)
    backend.open()
    assert [g.nvlink_peers for g in backend.node_info().gpus] == [(1,), (0,), ()]


def test_nvswitch_attached_gpus_are_all_nvlink_peers(fake_nvml_factory, fake_gpu_factory, clock):
    switch = pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH
    gpus = [
        fake_gpu_factory(
            uuid=f"GPU-{i}",
            bus_id=HGX_BUS[i],
            nvlink_remote={link: f"00000000:0{link}:00.0" for link in range(4)},
            nvlink_remote_type=dict.fromkeys(range(4), switch),
        )
        for i in range(4)
    ]
    backend = _backend(fake_nvml_factory(gpus), clock)
    backend.open()
    assert [g.nvlink_peers for g in backend.node_info().gpus] == [(1, 2, 3), (0, 2, 3), (0, 1, 3), (0, 1, 2)]


def test_mig_instances_are_listed_with_profile_and_placement(fake_nvml_factory, fake_gpu_factory, clock):
    mig = [
        {"uuid": "MIG-b", "gi_id": 2, "profile_id": 9, "start": 4, "size": 4},
        {"uuid": "MIG-a", "gi_id": 1, "profile_id": 19, "start": 0, "size": 1},
    ]
    fake = fake_nvml_factory([fake_gpu_factory(uuid="GPU-mig", mig_enabled=True, mig=mig)])
    backend = _backend(fake, clock)
    backend.open()
    gpu = backend.node_info().gpus[0]
    assert gpu.mig_mode is True
    assert gpu.mig_instances == (
        MigInstance(profile="1g.10gb", start=0, size=1, uuid="MIG-a"),
        MigInstance(profile="3g.40gb", start=4, size=4, uuid="MIG-b"),
    )


def test_xid_events_are_drained_without_blocking_and_latched_for_health(
    fake_nvml_factory, fake_gpu_factory, clock
):
    fake = fake_nvml_factory(
        [fake_gpu_factory(uuid="GPU-0"), fake_gpu_factory(uuid="GPU-1", bus_id=HGX_BUS[1])]
    )
    backend = _backend(fake, clock)
    backend.open()
    assert fake.registered == [0, 1]

    fake.events = [(1, 13), (1, 48), (0, 13)]
    first = backend.sample()
    assert first[0].xid_events == (13,) and first[0].health == "healthy"
    assert first[1].xid_events == (13, 48) and first[1].health == "failed"
    assert fake.events == []

    clock.advance(10)
    second = backend.sample()
    assert second[1].xid_events == ()  # reported once ...
    assert second[1].health == "failed"  # ... but a double-bit ECC error keeps the GPU failed
    assert "xid48:double_bit_ecc_error" in second[1].health_reasons
    assert second[0].health == "healthy"


def test_lost_gpu_is_reported_failed_instead_of_crashing_the_sample(
    fake_nvml_factory, fake_gpu_factory, clock
):
    gpus = [fake_gpu_factory(uuid="GPU-0"), fake_gpu_factory(uuid="GPU-1", bus_id=HGX_BUS[1])]
    backend = _backend(fake_nvml_factory(gpus), clock)
    backend.open()
    gpus[1].lost = True

    healthy, lost = backend.sample()
    assert healthy.health == "healthy"
    assert lost.health == "failed" and lost.health_reasons == ("gpu_lost",)
    assert lost.utilization_gpu_pct is None and lost.memory_used_mib is None


def test_thermal_throttling_reported_by_nvml_degrades_the_gpu(fake_nvml_factory, fake_gpu_factory, clock):
    gpu = fake_gpu_factory(
        uuid="GPU-0", temperature=88, throttle_mask=pynvml.nvmlClocksEventReasonHwThermalSlowdown
    )
    backend = _backend(fake_nvml_factory([gpu]), clock)
    backend.open()
    s = backend.sample()[0]
    assert s.throttle_reasons == ("hw_thermal_slowdown",)
    assert s.health == "degraded"
    assert s.health_reasons == ("temperature_at_slowdown:88C>=87C", "throttle:hw_thermal_slowdown")


def test_sampling_before_open_is_an_error(fake_nvml_factory, fake_gpu_factory, clock):
    backend = _backend(fake_nvml_factory([fake_gpu_factory(uuid="GPU-0")]), clock)
    with pytest.raises(RuntimeError, match="not open"):
        backend.sample()


def test_open_propagates_an_nvml_init_failure_and_close_stays_safe(
    fake_nvml_factory, fake_gpu_factory, clock
):
    fake = fake_nvml_factory([fake_gpu_factory(uuid="GPU-0")])
    fake.init_error = pynvml.NVMLError_DriverNotLoaded()
    backend = _backend(fake, clock)
    with pytest.raises(pynvml.NVMLError_DriverNotLoaded):
        backend.open()
    backend.close()
    with pytest.raises(RuntimeError):
        backend.node_info()


def test_every_nvml_name_the_real_backend_uses_exists_in_nvidia_ml_py():
    import inspect
    import re

    import services.agent.nvml_real as real
    import services.agent.nvml_real_extra as real_extra

    source = inspect.getsource(real) + inspect.getsource(real_extra)
    names = set(re.findall(r'"(nvml\w+|NVML_\w+)"', source))
    names |= set(re.findall(r"\b(?:nv|self\._nvml)\.(nvml\w+)", source))
    assert len(names) > 40
    assert sorted(n for n in names if not hasattr(pynvml, n)) == []


def test_hardcoded_nvml_bit_values_match_the_bindings():
    import services.agent.nvml_real as real

    assert real._XID_CRITICAL_EVENT == pynvml.nvmlEventTypeXidCriticalError
    expected = {
        "gpu_idle": pynvml.nvmlClocksEventReasonGpuIdle,
        "sw_power_cap": pynvml.nvmlClocksEventReasonSwPowerCap,
        "hw_slowdown": pynvml.nvmlClocksEventReasonHwSlowdown,
        "sw_thermal_slowdown": pynvml.nvmlClocksEventReasonSwThermalSlowdown,
        "hw_thermal_slowdown": pynvml.nvmlClocksEventReasonHwThermalSlowdown,
        "hw_power_brake_slowdown": pynvml.nvmlClocksEventReasonHwPowerBrakeSlowdown,
    }
    bits = {name: bit for bit, name in THROTTLE_REASON_BITS}
    assert {name: bits[name] for name in expected} == expected
