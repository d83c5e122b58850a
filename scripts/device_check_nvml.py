#!/usr/bin/env python3
"""Device check for the agent's real NVML backend.

Opens RealNvml, prints node_info() and three sample() rounds as JSON, closes it.

    .venv/bin/python scripts/device_check_nvml.py [--rounds 3] [--interval 1.0]

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
    finally:
        backend.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
