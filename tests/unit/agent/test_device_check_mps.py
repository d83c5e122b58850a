"""scripts/device_check_mps.py against the fake MPS control binary and a fake client (the real ones need a GPU:
the script is run on a lent GPU machine): it starts the GPU's daemon as the agent does, runs two fractions as its
clients with their limits at once, judges whether the limits held, stops the daemon, and exits by the verdict."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
from fake_mps import FAKE

SCRIPT = Path(__file__).resolve().parents[3] / "scripts" / "device_check_mps.py"
# Reports what an MPS client would see: the SMs its context may use, and its allocations against its memory limit;
# the broken one ignores the memory limit (as without MPS).
CLIENT = """
import json, math, os, sys
pct = int(os.environ["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"])
limit = int(os.environ["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"].split("=")[1].rstrip("M"))
assert os.environ["CUDA_MPS_PIPE_DIRECTORY"] and os.environ["CUDA_VISIBLE_DEVICES"] == "GPU-check"
broken = os.environ.get("BROKEN") == "1"
out = {"init": "ok", "device_sms": 132, "context": "ok", "affinity": "ok", "context_sms": math.ceil(132 * pct / 100)}
for mib in map(int, sys.argv[1:]):
    out[f"alloc_{mib}_mib"] = "ok" if broken or mib <= limit else "CUDA_ERROR_OUT_OF_MEMORY"
print(json.dumps(out))
"""


@pytest.fixture
def check():
    spec = importlib.util.spec_from_file_location("device_check_mps", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def control(tmp_path: Path) -> str:
    path = tmp_path / "nvidia-cuda-mps-control"
    path.write_text(FAKE)
    path.chmod(0o755)
    return str(path)


def client(tmp_path: Path, text: str = CLIENT) -> str:
    path = tmp_path / "client"
    path.write_text(f"#!{sys.executable}\n{text}")
    path.chmod(0o755)
    return str(path)


def test_two_fractions_run_as_clients_of_one_daemon_and_their_limits_are_judged(check, control, capsys,
                                                                                 tmp_path) -> None:
    assert check.main(["--gpu", "GPU-check", "--control", control, "--client", client(tmp_path)]) == 0
    doc = json.loads(capsys.readouterr().out)["data"]
    assert doc["held"] and doc["daemon_pid"] and doc["daemon_stopped"]
    assert [(f["active_thread_percentage"], f["pinned_mem_limit_mib"]) for f in doc["fractions"]] == [
        (25, 1024), (50, 2048)]
    first = doc["fractions"][0]
    assert (first["within_limit"], first["beyond_limit"], first["context_sms"]) == (
        "ok", "CUDA_ERROR_OUT_OF_MEMORY", 33)


def test_a_limit_that_did_not_hold_fails_the_check(check, control, capsys, tmp_path) -> None:
    broken = client(tmp_path, CLIENT.replace('os.environ.get("BROKEN") == "1"', "True"))
    assert check.main(["--gpu", "GPU-check", "--control", control, "--client", broken]) == 1
    doc = json.loads(capsys.readouterr().out)["data"]
    assert not doc["held"] and not doc["fractions"][0]["memory_limit_held"]


def test_without_the_control_binary_it_says_so_in_one_line(check, tmp_path, capsys) -> None:
    assert check.main(["--gpu", "GPU-x", "--control", str(tmp_path / "absent")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("MPS not available: ") and err.count("\n") == 1
