from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pynvml
import pytest

SCRIPT = Path(__file__).resolve().parents[3] / "scripts" / "device_check_nvml.py"


@pytest.fixture
def device_check():
    spec = importlib.util.spec_from_file_location("device_check_nvml", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_device_check_exits_2_with_a_one_line_message_when_nvml_cannot_start(
    device_check, monkeypatch, capsys
):
    def no_driver():
        raise pynvml.NVMLError_LibraryNotFound()

    monkeypatch.setattr(pynvml, "nvmlInit", no_driver)
    assert device_check.main([]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith("NVML not available: ") and "Traceback" not in err
    assert err.count("\n") == 1


def _docs(out: str) -> list[dict]:
    decoder, docs, pos = json.JSONDecoder(), [], 0
    while pos < len(out.rstrip()):
        doc, pos = decoder.raw_decode(out, pos)
        docs.append(doc)
        pos += len(out[pos:]) - len(out[pos:].lstrip())
    return docs


@pytest.fixture
def fake_machine(monkeypatch, fake_nvml_factory, fake_gpu_factory):
    """The script's RealNvml on the fake NVML module: one H100 in MIG mode with a 3g.40gb instance, one not."""
    from services.agent.nvml_real import RealNvml

    mig = [{"uuid": "MIG-a", "gi_id": 1, "profile_id": 9, "start": 4, "size": 4, "pids": {77: 700}}]
    fake = fake_nvml_factory([
        fake_gpu_factory(uuid="GPU-mig", mig_enabled=True, mig=mig, pids=()),
        fake_gpu_factory(uuid="GPU-plain", bus_id="00000000:2a:00.0", pids=(4242,), proc_mem_mib={4242: 1000}),
    ])

    class FakeReal(RealNvml):
        def __init__(self, _nvml):
            super().__init__(fake, hostname="h100-box", read_bytes=lambda path: b"GPUPOOL_ALLOCATION_ID=al-1\0")

    monkeypatch.setattr("services.agent.nvml_real.RealNvml", FakeReal)
    return fake


def test_device_check_prints_node_info_samples_processes_and_mig_capability_as_json(
        device_check, fake_machine, capsys):
    assert device_check.main(["--interval", "0"]) == 0
    docs = _docs(capsys.readouterr().out)
    assert [d["kind"] for d in docs] == ["node_info"] + ["sample", "node_sample"] * 3 + ["processes", "mig"]
    assert {"network", "storage"} <= set(docs[0]["data"]) and docs[0]["data"]["storage"][0]["mount"] == "/"
    assert docs[4]["data"]["memory_used_mib"] > 0 and "cpu_util_pct" in docs[4]["data"]  # this host's /proc
    assert docs[0]["data"]["gpus"][0]["model"] == "H100-80GB"
    assert docs[1]["data"][1]["health"] == "healthy"
    assert {(p["pid"], p["used_memory_mib"], p["mig_uuid"], p["allocation_id"]) for p in docs[7]["data"]} == {
        (77, 700, "MIG-a", "al-1"), (4242, 1000, None, "al-1")}
    mig_gpu, plain = docs[8]["data"]
    assert [i["profile"] for i in mig_gpu["instances"]] == ["3g.40gb"] and plain["instances"] == []
    assert plain["mig_mode"]["current"] == pynvml.NVML_DEVICE_MIG_DISABLE
    by_name = {p["name"]: p for p in mig_gpu["profiles"]}
    assert by_name["3g.40gb"]["placements"] == {"0": 4, "4": 4}
    assert fake_machine.mig_ops == []  # read-only: nothing created or destroyed


def test_device_check_mig_roundtrip_uses_a_free_slot_on_a_gpu_already_in_mig_mode(device_check, fake_machine, capsys):
    assert device_check.main(["--rounds", "0", "--mig-roundtrip", "3g.40gb"]) == 0
    roundtrip = _docs(capsys.readouterr().out)[-1]
    assert roundtrip["kind"] == "mig_roundtrip"
    assert (roundtrip["data"]["gpu"], roundtrip["data"]["start"], roundtrip["data"]["destroyed"]) == (0, 0, True)
    assert [op[0] for op in fake_machine.mig_ops] == ["create_gi", "ci_profile", "create_ci", "destroy_ci",
                                                      "destroy_gi"]
    assert [m["start"] for m in fake_machine.gpus[0].mig] == [4]  # the instance that was there stays
