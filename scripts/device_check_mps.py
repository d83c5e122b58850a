#!/usr/bin/env python3
"""Device check for fractions under CUDA MPS, the way the agent runs them (services/agent/mps.py).

Starts the agent's MPS control daemon for one GPU (MpsControl: its own pipe and log directories), runs two
fractions on that GPU at once as its clients, each with the limits a grant carries
(CUDA_MPS_ACTIVE_THREAD_PERCENTAGE, CUDA_MPS_PINNED_DEVICE_MEM_LIMIT), and has each client report through the
CUDA driver API (ctypes on libcuda, nothing to install): the SM count its context may use
(cuCtxGetExecAffinity), whether an allocation within its memory limit succeeds, and whether one beyond it is
refused. Then it stops the daemon. Prints one JSON document; `held` says whether both limits held for both.

    .venv/bin/python scripts/device_check_mps.py [--gpu UUID] [--control nvidia-cuda-mps-control]

Exit codes: 0 the limits held; 1 they did not (the document says which); 2 no MPS control binary, no NVML or no
GPU (one line on stderr). `--client PROGRAM` replaces the client (tests run a fake one).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

if __package__ in (None, ""):  # run as a file: make the repo root importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# Each fraction: (share of the SMs, pinned memory MiB). The client allocates half its limit, then twice it.
FRACTIONS = ((25, 1024), (50, 2048))
CLIENT = r"""
import ctypes, json, os, sys
cuda = ctypes.CDLL("libcuda.so.1")
def err(rc):
    if rc == 0:
        return "ok"
    name = ctypes.c_char_p()
    cuda.cuGetErrorName(rc, ctypes.byref(name))
    return name.value.decode() if name.value else str(rc)
class Affinity(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("val", ctypes.c_uint)]
out = {"init": err(cuda.cuInit(0))}
dev, sms, ctx = ctypes.c_int(), ctypes.c_int(), ctypes.c_void_p()
cuda.cuDeviceGet(ctypes.byref(dev), 0)
cuda.cuDeviceGetAttribute(ctypes.byref(sms), 16, dev)  # CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT
out["device_sms"] = sms.value
out["context"] = err(cuda.cuCtxCreate_v2(ctypes.byref(ctx), 0, dev))
aff = Affinity()
out["affinity"] = err(cuda.cuCtxGetExecAffinity(ctypes.byref(aff), 0))  # CU_EXEC_AFFINITY_TYPE_SM_COUNT
out["context_sms"] = aff.val
for mib in map(int, sys.argv[1:]):
    ptr = ctypes.c_uint64()
    rc = cuda.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(mib << 20))
    out[f"alloc_{mib}_mib"] = err(rc)
    if rc == 0:
        cuda.cuMemFree_v2(ptr)
print(json.dumps(out), flush=True)
"""


def first_gpu() -> str | None:
    """The first GPU not in MIG mode (MPS serves whole GPUs), by NVML; None without NVML or such a GPU."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:
        return None
    try:
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            try:
                current, _ = pynvml.nvmlDeviceGetMigMode(handle)
            except pynvml.NVMLError:
                current = 0
            if not current:
                uuid = pynvml.nvmlDeviceGetUUID(handle)
                return uuid.decode() if isinstance(uuid, bytes) else uuid
        return None
    finally:
        pynvml.nvmlShutdown()


def judge(pct: int, limit_mib: int, seen: dict) -> dict:
    """Whether one client's limits held: its context got about `pct` % of the SMs (rounded up, at least one), an
    allocation within its memory limit succeeded and one beyond it was refused."""
    small, big = seen.get(f"alloc_{limit_mib // 2}_mib"), seen.get(f"alloc_{limit_mib * 2}_mib")
    device, granted = int(seen.get("device_sms") or 0), int(seen.get("context_sms") or 0)
    sm_ok = seen.get("affinity") == "ok" and device > 0 and 0 < granted <= max(1, -(-device * pct // 100))
    return {"sm_limit_held": sm_ok, "memory_limit_held": small == "ok" and big not in (None, "ok"),
            "within_limit": small, "beyond_limit": big, "context_sms": granted, "device_sms": device}


def run(gpu: str, control: str, client: list[str]) -> dict:
    from services.agent.mps import MpsControl

    with tempfile.TemporaryDirectory(prefix="gpupool-mps-check-") as root:
        mps = MpsControl(Path(root), control)
        env = mps.ensure(gpu)
        daemon = mps.pid(gpu)
        try:
            procs = []
            for pct, mib in FRACTIONS:  # both at once: two clients of one daemon
                limits = {"CUDA_VISIBLE_DEVICES": gpu, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": str(pct),
                          "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": f"0={mib}M", "PATH": "/usr/bin:/bin"}
                procs.append(subprocess.Popen([*client, str(mib // 2), str(mib * 2)], env={**env, **limits},
                                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
            fractions = []
            for (pct, mib), proc in zip(FRACTIONS, procs, strict=True):
                out, err = proc.communicate(timeout=120)
                try:
                    seen = json.loads(out.strip().splitlines()[-1])
                except (ValueError, IndexError):
                    seen = {"error": (err or out)[-500:]}
                fractions.append({"active_thread_percentage": pct, "pinned_mem_limit_mib": mib, "seen": seen,
                                  **judge(pct, mib, seen)})
        finally:
            stopped = mps.stop(gpu)
    held = all(f["sm_limit_held"] and f["memory_limit_held"] for f in fractions)
    return {"gpu": gpu, "daemon_pid": daemon, "daemon_stopped": stopped, "fractions": fractions, "held": held}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpu", help="GPU uuid (default: the first GPU not in MIG mode)")
    parser.add_argument("--control", default="nvidia-cuda-mps-control", help="the MPS control binary")
    parser.add_argument("--client", metavar="PROGRAM",
                        help="the client program, run with the two sizes in MiB (default: the ctypes probe)")
    args = parser.parse_args(argv)
    from services.agent.mps import MpsControl, MpsError

    if MpsControl.find(args.control) is None:
        print(f"MPS not available: {args.control} not found", file=sys.stderr)
        return 2
    gpu = args.gpu or first_gpu()
    if gpu is None:
        print("MPS not available: no NVML, or no GPU outside MIG mode", file=sys.stderr)
        return 2
    try:
        doc = run(gpu, args.control, [args.client] if args.client else [sys.executable, "-c", CLIENT])
    except MpsError as exc:
        print(f"MPS not available: {exc}", file=sys.stderr)
        return 2
    print(json.dumps({"kind": "mps_fractions", "data": doc}, indent=2), flush=True)
    return 0 if doc["held"] else 1


if __name__ == "__main__":
    sys.exit(main())
