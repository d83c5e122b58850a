"""Synthetic variants of an openb task list for the fill experiment, made the way FGD's own variants are described
(alibaba/clusterdata, cluster-trace-gpu-v2023: "gpuspec" lists add GPU-model constraints to part of the GPU tasks;
the other lists are sampled from the default one, emphasising a kind of task). Their files are not on this machine,
so these are stand-ins, deterministic for a seed — not FGD's files, and their numbers are not comparable to its.

    python -m libs.sim.mixes pinned TASKS.csv OUT.csv [--share 0.33] [--seed 0]
    python -m libs.sim.mixes sharing TASKS.csv OUT.csv [--share 0.8] [--seed 0]

* `pinned`: each GPU task is pinned with probability `share` (a seeded hash of its name) to a `gpu_spec` drawn
  from `PINNED_SPECS` (the constraints and their frequencies as they appear at the start of FGD's
  `openb_pod_list_gpuspec33.csv`: T4 alone is the most common), among the specs some node could hold it on.
* `sharing`: as many tasks as the list, drawn with replacement: CPU-only tasks where the list has one, else a
  GPU-sharing task with probability `share`, a whole-GPU task otherwise.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import random
from pathlib import Path

# (gpu_spec, relative frequency) of the pinned tasks; the most GPUs one node of each model has in openb
PINNED_SPECS = (("T4", 33), ("V100M16|V100M32", 13), ("G2", 10), ("P100", 5), ("P100|V100M16|V100M32", 3),
                ("G3", 2), ("G2|P100|T4|V100M16|V100M32", 2), ("P100|T4|V100M16|V100M32", 2))
MODEL_GPUS = {"T4": 4, "V100M16": 8, "V100M32": 8, "G2": 8, "P100": 2, "G3": 8}


def _u(seed: int, salt: str, name: str) -> float:
    return int(hashlib.sha256(f"{seed}:{salt}:{name}".encode()).hexdigest()[:8], 16) / 2**32


def pinned(rows: list[dict], share: float = 0.33, seed: int = 0) -> list[dict]:
    out = []
    for r in rows:
        r = dict(r)
        gpus = int(float(r["num_gpu"] or 0))
        if gpus > 0 and not r.get("gpu_spec") and _u(seed, "pin", r["name"]) < share:
            able = [(s, w) for s, w in PINNED_SPECS if max(MODEL_GPUS[m] for m in s.split("|")) >= gpus]
            x = _u(seed, "spec", r["name"]) * sum(w for _, w in able)
            for spec, w in able:
                x -= w
                if x < 0:
                    r["gpu_spec"] = spec
                    break
        out.append(r)
    return out


def sharing(rows: list[dict], share: float = 0.8, seed: int = 0) -> list[dict]:
    def kind(r: dict) -> str:
        gpus = int(float(r["num_gpu"] or 0))
        if gpus == 0:
            return "cpu"
        return "share" if gpus == 1 and int(float(r["gpu_milli"] or 1000)) < 1000 else "whole"

    pools: dict[str, list[dict]] = {"cpu": [], "share": [], "whole": []}
    for r in rows:
        pools[kind(r)].append(r)
    rng = random.Random(seed)
    out = []
    for i, r in enumerate(rows):
        pool = pools["cpu"] if kind(r) == "cpu" else pools["share"] if rng.random() < share else pools["whole"]
        row = dict(rng.choice(pool))
        row["name"] = f"sharing-{i:05d}"
        out.append(row)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m libs.sim.mixes", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("mix", choices=("pinned", "sharing"))
    p.add_argument("tasks", type=Path)
    p.add_argument("out", type=Path)
    p.add_argument("--share", type=float, default=None, help="pinned: 0.33; sharing: 0.8")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    if a.share is not None and not 0.0 <= a.share <= 1.0:
        p.error("--share must be between 0 and 1")
    with a.tasks.open(newline="") as f:
        reader = csv.DictReader(f)
        fields = list(reader.fieldnames or [])
        rows = list(reader)
    if "gpu_spec" not in fields:
        fields.append("gpu_spec")
    made = pinned(rows, 0.33 if a.share is None else a.share, a.seed) if a.mix == "pinned" else \
        sharing(rows, 0.8 if a.share is None else a.share, a.seed)
    with a.out.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        w.writerows(made)
    print(f"{len(made)} tasks written to {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
