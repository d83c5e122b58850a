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


def test_device_check_prints_node_info_and_three_sample_rounds_as_json(device_check, monkeypatch, capsys):
    from services.agent.nvml_sim import SimulatedNvml

    class SimAsReal(SimulatedNvml):
        def __init__(self, _nvml):
            super().__init__("h200-box", ["H200-141GB"], seed=1, clock=lambda: 0.0)

    monkeypatch.setattr("services.agent.nvml_real.RealNvml", SimAsReal)
    assert device_check.main(["--interval", "0"]) == 0
    out = capsys.readouterr().out
    decoder, docs, pos = json.JSONDecoder(), [], 0
    while pos < len(out.rstrip()):
        doc, pos = decoder.raw_decode(out, pos)
        docs.append(doc)
        pos += len(out[pos:]) - len(out[pos:].lstrip())
    assert [d["kind"] for d in docs] == ["node_info", "sample", "sample", "sample"]
    assert docs[0]["data"]["gpus"][0]["model"] == "H200-141GB"
    assert docs[1]["data"][0]["health"] == "healthy"
