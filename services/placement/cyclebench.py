"""The measuring half of `gpupool bench placement-cycle` (libs/bench/placement_cycle.py starts the servers, runs
this as `python -m services.placement.cyclebench`, and reports): fills placement's store the way its events would
(nodes and GPUs registered, jobs wanted, allocations written by the store's own statements) with N nodes × 8 GPUs,
R running allocations that fill every GPU, and W waiting jobs; then runs placement's own cycle
(`PlacementHandlers.run_cycle`) and times its phases (`PlacementHandlers.phases`) and the CPU time this process spent on
it (`cpu_s`: on a busy machine the wall time also counts waiting for a CPU). After a first, cold cycle it
turns jobs over: one running one-GPU job completes (placement's own release path) and the next cycle must give the
freed GPU to a waiting job. Writes the result as JSON."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

GPUS_PER_NODE = 8
NOW = datetime(2026, 12, 1, tzinfo=UTC)
TEAMS = ("vision", "nlp", "speech", "rl")


def running_sizes(allocations: int, gpus: int) -> list[int]:
    """GPUs per running allocation: `allocations` of them holding exactly `gpus` together, mostly one-GPU jobs
    with some 8-, 4- and 2-GPU ones (biggest first). ValueError when they cannot."""
    extra = gpus - allocations
    eights = min(allocations // 50, max(extra, 0) // 7)
    extra -= 7 * eights
    fours = min((allocations - eights) // 20, max(extra, 0) // 3)
    extra -= 3 * fours
    if extra < 0 or eights + fours + extra > allocations:
        raise ValueError(f"{allocations} allocations cannot hold exactly {gpus} GPUs")
    return [8] * eights + [4] * fours + [2] * extra + [1] * (allocations - eights - fours - extra)


def pack(sizes: list[int], nodes: int) -> list[tuple[int, list[int]]]:
    """(node index, GPU indices) for each size (sizes are powers of two, biggest first): next fit, which fills
    every node."""
    out, n, free = [], 0, list(range(GPUS_PER_NODE))
    for size in sizes:
        if len(free) < size:
            n, free = n + 1, list(range(GPUS_PER_NODE))
        if n >= nodes:
            raise ValueError("more GPUs asked for than the nodes have")
        out.append((n, [free.pop(0) for _ in range(size)]))
    return out


async def fill(pool, nodes: int, running: int, waiting: int) -> list[str]:  # type: ignore[no-untyped-def]
    """The store as events would leave it; returns the running one-GPU jobs (the ones turned over)."""
    from libs.contracts.envelope import uuid7
    from libs.contracts.events import GpuSpec, JobSubmitted, NodeRegistered
    from services.placement import store

    def job(job_id: str, i: int, gpus: int, at: datetime) -> JobSubmitted:
        return JobSubmitted(job_id=job_id, name=job_id, team=TEAMS[i % len(TEAMS)], project="default", kind="batch",
                            priority_class="normal", priority=0, gpus=gpus, submitted_at=at, cpu_milli=1000,
                            memory_mib=4096)

    async with pool.acquire() as conn, conn.transaction():
        for n in range(nodes):
            rack = f"r{n // 32}"
            await store.upsert_node(conn, NodeRegistered(
                cluster="c", node=f"n{n:04d}", hostname=f"n{n:04d}", cpu_count=128, memory_mib=1_024_000,
                registered_at=NOW, labels={"topology.gpupool.io/rack": rack},
                gpus=[GpuSpec(uuid=f"G{n:04d}-{g}", index=g, model="H100", memory_mib=81_920, numa_node=g // 4)
                      for g in range(GPUS_PER_NODE)]))
        sizes = running_sizes(running, nodes * GPUS_PER_NODE)
        placed = pack(sizes, nodes)
        allocations, shares, ones = [], [], []
        for i, (size, (n, idxs)) in enumerate(zip(sizes, placed, strict=True)):
            job_id = f"run-{i:05d}"
            data = job(job_id, i, size, NOW - timedelta(hours=2))
            await store.add_pending(conn, data, None)
            aid = uuid7()
            allocations.append((aid, job_id, 0, data.team, "default", "c", f"n{n:04d}",
                                NOW - timedelta(hours=1, seconds=i), 0, "normal", "batch", None, None, 0, None, None,
                                None, False, 1000, 4096, None))
            shares += [(aid, f"G{n:04d}-{g}", g, "H100", 1000, 81_920, None, None, None) for g in idxs]
            if size == 1:
                ones.append(job_id)
        await store.insert_allocations(conn, allocations, shares)
        await store.refresh_satisfied_many(conn, [a[1] for a in allocations])  # they hold what they want
        for i in range(waiting):
            gpus = 8 if i % 50 == 0 else 4 if i % 20 == 0 else 2 if i % 10 == 0 else 1
            await store.add_pending(conn, job(f"wait-{i:05d}", i, gpus, NOW + timedelta(seconds=i)), None)
    async with pool.acquire() as conn:
        # the planner's statistics, as autovacuum gathers them soon after tables grow this much: without, the
        # cycle's read is planned for empty tables (nested loops over thousands of rows)
        await store.analyze(conn)
    return ones


async def measure(nodes: int, running: int, waiting: int, turnovers: int, nats_url: str, dsn: str) -> dict:
    from libs.contracts.envelope import utcnow
    from libs.runtime.service import ServiceRuntime
    from services.placement.bootstrap import tune_collector
    from services.placement.config import PlacementSettings
    from services.placement.handlers import PlacementHandlers

    settings = PlacementSettings(nats_url=nats_url, database_url=dsn, http_port=0, log_level="WARNING",
                                 instance="bench-placement-cycle", cycle_interval_s=3600)
    rt = ServiceRuntime("placement", settings, migrations_package="services.placement")
    await rt.start()
    tune_collector()  # as the service does once started
    try:
        t = time.perf_counter()
        ones = await fill(rt.pool, nodes, running, waiting)
        filled_s = time.perf_counter() - t
        h = PlacementHandlers(rt, settings)
        started_load = os.getloadavg()[0]  # the machine's other work: on a busy one a cycle waits for a CPU
        t, cpu = time.perf_counter(), time.process_time()
        first = await h.run_cycle()
        cold = {"total_s": time.perf_counter() - t, "cpu_s": time.process_time() - cpu, **h.phases, "placed": first}
        rows, placed = [], 0
        for k in range(turnovers):
            victim = ones[k]
            t = time.perf_counter()
            async with rt.uow() as uow:
                await h._release(uow, victim, "JobCompleted", utcnow(), finished=True)
            released, cpu = time.perf_counter(), time.process_time()
            got = await h.run_cycle()
            done = time.perf_counter()
            placed += got
            rows.append({"next_job_s": done - t, "cycle_s": done - released, "cpu_s": time.process_time() - cpu,
                         **h.phases})
        return {"nodes": nodes, "gpus": nodes * GPUS_PER_NODE, "running": running, "waiting": waiting,
                "load_avg": [round(started_load, 2), round(os.getloadavg()[0], 2)],
                "fill_s": round(filled_s, 1), "cold": cold, "turnovers": turnovers, "placed": placed,
                "steady": {k: statistics.median(r[k] for r in rows) for k in rows[0]} if rows else {},
                "steady_p90": {k: sorted(r[k] for r in rows)[int(0.9 * (len(rows) - 1))] for k in rows[0]}
                if rows else {}}
    finally:
        await rt.shutdown()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m services.placement.cyclebench")
    parser.add_argument("--nats-url", required=True)
    parser.add_argument("--database-url", required=True)
    parser.add_argument("--nodes", type=int, default=1024)
    parser.add_argument("--running", type=int, default=6000)
    parser.add_argument("--waiting", type=int, default=10_000)
    parser.add_argument("--turnovers", type=int, default=20)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    result = asyncio.run(measure(args.nodes, args.running, args.waiting, args.turnovers, args.nats_url,
                                 args.database_url))
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
