#!/usr/bin/env python3
"""Device check for the agent's real NVML backend.

Opens RealNvml, prints node_info() (with the node's NICs and volumes), three sample() rounds each followed by the
node's CPU / memory / network / storage reading, the GPU processes (memory, allocation from
GPUPOOL_ALLOCATION_ID) and each GPU's MIG capability as JSON, closes it. Read-only: it creates no MIG instance and
stops no process; with --mig-roundtrip PROFILE it creates and destroys one instance of PROFILE on the first GPU
that is already in MIG mode and has a free slot for it (never switching a GPU's MIG mode).

    .venv/bin/python scripts/device_check_nvml.py [--rounds 3] [--interval 1.0] [--mig-roundtrip 1g.10gb]

Exit codes: 0 ok; 2 NVML could not be initialised (no driver / no GPU / no library),
printed as one "NVML not available: ..." line on stderr, no traceback.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a file: make the repo root importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

EXIT_NVML_UNAVAILABLE = 2


def _emit(kind: str, payload: object) -> None:
    print(json.dumps({"kind": kind, "data": payload}, indent=2, sort_keys=False, default=str), flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between sample rounds")
    parser.add_argument("--mig-roundtrip", metavar="PROFILE", default=None,
                        help="create and destroy one PROFILE instance on a GPU already in MIG mode")
    args = parser.parse_args(argv)

    try:
        import pynvml

        from services.agent.nvml_real import RealNvml
    except ImportError as exc:
        print(f"NVML not available: cannot import the NVML bindings ({exc})", file=sys.stderr)
        return EXIT_NVML_UNAVAILABLE

    backend = RealNvml(pynvml)
    try:
        backend.open()
    except pynvml.NVMLError as exc:
        print(f"NVML not available: {exc} ({type(exc).__name__})", file=sys.stderr)
        return EXIT_NVML_UNAVAILABLE
    except OSError as exc:
        print(f"NVML not available: {exc}", file=sys.stderr)
        return EXIT_NVML_UNAVAILABLE

    try:
        _emit("node_info", dataclasses.asdict(backend.node_info()))
        for round_no in range(args.rounds):
            if round_no:
                time.sleep(args.interval)
            _emit("sample", [dataclasses.asdict(s) for s in backend.sample()])
            _emit("node_sample", dataclasses.asdict(backend.node_sample()))
        _emit("processes", [dataclasses.asdict(p) for p in backend.processes()])
        _emit("mig", mig_capability(backend))
        if args.mig_roundtrip:
            _emit("mig_roundtrip", mig_roundtrip(backend, args.mig_roundtrip))
    finally:
        backend.close()
    return 0


def mig_capability(backend) -> list[dict]:  # type: ignore[no-untyped-def]
    """Per GPU: MIG mode (current/pending), its instances now, and the GPU-instance profiles with their allowed
    placements, as `nvidia-smi mig -lgip` / `-lgipp` would list them. Read-only."""
    from services.agent.nvml_real import _mig_profile_name

    nv = backend._nvml
    layout = backend.mig_layout()
    out = []
    for info in backend.node_info().gpus:
        handle = backend._handles[info.index]
        mode = backend._guard("nvmlDeviceGetMigMode", handle)
        profiles = []
        for enum in range(backend._const("NVML_GPU_INSTANCE_PROFILE_COUNT", 0)):
            prof = backend._guard("nvmlDeviceGetGpuInstanceProfileInfo", handle, enum)
            if prof is None:
                continue
            try:
                placements = backend._placements(handle, int(prof.id))
            except nv.NVMLError as exc:
                placements = {"error": type(exc).__name__}
            profiles.append({"enum": enum, "id": int(prof.id), "name": _mig_profile_name(prof),
                             "slices": int(prof.sliceCount), "memory_mb": int(prof.memorySizeMB),
                             "placements": placements})
        out.append({"index": info.index, "uuid": info.uuid, "model": info.model,
                    "mig_mode": {"current": mode[0], "pending": mode[1]} if mode else None,
                    "instances": [dataclasses.asdict(m) for m in layout.get(info.index) or ()],
                    "profiles": profiles})
    return out


def mig_roundtrip(backend, profile: str) -> dict:  # type: ignore[no-untyped-def]
    """Create then destroy one instance on a GPU already in MIG mode, at the first slot NVML offers that no
    instance holds. Skipped (not failed) when no GPU is in MIG mode."""
    from services.agent.nvml_types import MigError

    for index, instances in backend.mig_layout().items():
        if instances is None:
            continue
        handle = backend._handles[index]
        prof = backend._gi_profile(handle, profile)
        if prof is None:
            return {"skipped": f"GPU {index} has no profile {profile}"}
        taken = 0
        for m in instances:
            taken |= ((1 << (m.size or 1)) - 1) << (m.start or 0)
        free = [s for s, size in sorted(backend._placements(handle, int(prof.id)).items())
                if not taken & (((1 << size) - 1) << s)]
        if not free:
            continue
        try:
            made = backend.create_mig_instance(index, profile, free[0])
        except MigError as exc:
            return {"gpu": index, "start": free[0], "created": False, "reason": exc.reason, "error": str(exc)}
        backend.destroy_mig_instance(index, free[0])
        gone = all(m.start != free[0] for m in backend.mig_layout()[index] or ())
        return {"gpu": index, "start": free[0], "created": dataclasses.asdict(made), "destroyed": gone}
    return {"skipped": "no GPU in MIG mode with a free slot"}


if __name__ == "__main__":
    sys.exit(main())
