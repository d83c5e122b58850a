"""Builders for simulator tests: tiny generated node lists and traces (tests never read ../shared)."""

from __future__ import annotations

import csv
import random
from pathlib import Path

OPENB_TASK_COLUMNS = ["name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli", "gpu_spec", "qos", "pod_phase",
                      "creation_time", "deletion_time", "scheduled_time"]


def write_csv(path: Path, header: list[str], rows: list[list]) -> Path:
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(header)
        w.writerows(rows)
    return path


def node_list(path: Path, shapes=((8, "G2", 96000, 393216, 6), (2, "T4", 64000, 262144, 6))) -> Path:
    """openb-format node list: (gpus, model, cpu_milli, memory_mib, count) per row kind."""
    rows = []
    i = 0
    for gpus, model, cpu, mem, count in shapes:
        for _ in range(count):
            rows.append([f"node-{i:03d}", cpu, mem, gpus, model])
            i += 1
    return write_csv(path, ["sn", "cpu_milli", "memory_mib", "gpu", "model"], rows)


def openb_tasks(path: Path, n: int = 200, seed: int = 7, timed: bool = True) -> Path:
    """An openb-shaped task list: mostly single GPUs and fractions (the common gpu_milli values of the real trace),
    a few multi-GPU and CPU-only tasks."""
    rng = random.Random(seed)
    rows = []
    t = 0
    for i in range(n):
        kind = rng.random()
        if kind < 0.1:
            num_gpu, milli = 0, 0
        elif kind < 0.45:
            num_gpu, milli = 1, rng.choice((810, 470, 320, 650, 230))
        elif kind < 0.95:
            num_gpu, milli = 1, 1000
        else:
            num_gpu, milli = rng.choice((2, 4, 8)), 1000
        cpu = rng.choice((2000, 4000, 8000, 12000))
        mem = rng.choice((4096, 16384, 32768))
        t += rng.randint(0, 120)
        run = rng.randint(60, 4000)
        row = [f"pod-{i:04d}", cpu, mem, num_gpu, milli, "", rng.choice(("LS", "BE", "Burstable")), "Succeeded"]
        row += [t, t + run + 5, t + 5] if timed else ["", "", ""]
        rows.append(row)
    return write_csv(path, OPENB_TASK_COLUMNS, rows)


def generic_trace(path: Path, n: int = 120, seed: int = 3) -> Path:
    rng = random.Random(seed)
    rows = []
    t = 0.0
    for i in range(n):
        t += rng.uniform(0, 60)
        gpus = rng.choice((1, 1, 1, 2, 4, 8))
        rows.append([f"j{i:04d}", round(t, 1), rng.randint(30, 3000), gpus, rng.choice(("", "G2")),
                     rng.choice(("alpha", "beta", "gamma")), rng.choice((0, 0, 100, -100))])
    return write_csv(path, ["job_id", "submit_time", "duration", "gpus", "gpu_model", "team", "priority"], rows)
