"""`gpupool bench`: measure the scheduling core and the simulator, write docs/benchmarks.md.

Measures (medians of repeated runs, each policy against a baseline run in the same process):

1. placement decisions per second: one `schedule()` call on 1,024 nodes x 8 GPUs with 20,000 mixed pending jobs
   (whole GPUs, NVLink-local multi-GPU, gangs, fractions, MIG, CPU-only; 8 teams with quotas; 5 priority classes);
2. cycle time of the same at 4,096 nodes;
3. the fill experiment on the openb trace (gpupool `default` vs `best-fit`, unallocated GPU share at 100% arrived);
4. a timed replay of the openb trace on a shrunk cluster (JCT and queueing, `default` vs `fifo` and `best-fit`).

3 and 4 need the trace in ../shared/traces; without it they are skipped and the report says so.
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import statistics
import sys
import time
from pathlib import Path

from libs.core import Gpu, JobRequest, MigInstance, Node, Policy, Snapshot, schedule, teams_quota
from libs.sim import cli as simcli
from libs.sim import engine, traces

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "benchmarks.md"
CLASSES = ("production-inference", "high", "normal", "low", "best-effort")
TEAMS = tuple(f"team-{i}" for i in range(8))


def synthetic_cluster(n_nodes: int, seed: int = 0) -> list[Node]:
    """70% exclusive 8 x H100 nodes (two NVLink domains of 4), 15% shareable 8 x L40S, 15% 8 x A100-80GB in MIG
    mode; 16 racks."""
    rng = random.Random(seed)
    nodes = []
    for i in range(n_nodes):
        name = f"node-{i:05d}"
        r = rng.random()
        if r < 0.70:
            model, sharing, mem = "H100-80GB", "exclusive", 81920
        elif r < 0.85:
            model, sharing, mem = "L40S", "fractional", 46068
        else:
            model, sharing, mem = "A100-80GB", "mig", 81920
        gpus = tuple(
            Gpu(f"{name}-g{k}", k, model, mem, sharing=sharing, nvlink_domain=f"{name}-nv{k // 4}",
                numa_node=k // 4, mig_instances=(MigInstance("3g.40gb", 0),) if sharing == "mig" and k == 0 else ())
            for k in range(8)
        )
        nodes.append(Node(name, "bench", gpus, topology=f"rack-{i % 16}", cpu_milli=128000, memory_mib=1048576))
    return nodes


def synthetic_jobs(n: int, seed: int = 1) -> list[JobRequest]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        team = rng.choice(TEAMS)
        common = dict(job_id=f"job-{i:06d}", team=team, submitted_at=float(rng.randint(0, 3600)),
                      priority_class=rng.choice(CLASSES), cpu_milli=rng.choice((2000, 8000)),
                      memory_mib=rng.choice((8192, 65536)))
        r = rng.random()
        if r < 0.50:
            out.append(JobRequest(gpus=rng.choice((1, 1, 1, 2, 4, 8)), **common))
        elif r < 0.65:
            out.append(JobRequest(gpus=1, gpu_fraction_milli=rng.choice((250, 500, 750)),
                                  gpu_memory_mib=rng.choice((8192, 16384)), **common))
        elif r < 0.78:
            out.append(JobRequest(gpus=1, mig_profile=rng.choice(("1g.10gb", "2g.20gb", "3g.40gb")), **common))
        elif r < 0.88:
            k = rng.choice((2, 4))
            out.append(JobRequest(gpus=8 * k, gang_nodes=k, gpus_per_node=8, **common))
        elif r < 0.93:
            out.append(JobRequest(gpus=rng.choice((12, 24)), gang=True, **common))
        else:
            out.append(JobRequest(gpus=0, **common))
    return out


def _median_time(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def bench_decisions(n_nodes: int, n_jobs: int, repeats: int) -> dict:
    nodes = synthetic_cluster(n_nodes)
    snap = Snapshot(tuple(nodes))
    jobs = synthetic_jobs(n_jobs)
    gpus = n_nodes * 8
    quotas = teams_quota({t: gpus / len(TEAMS) for t in TEAMS})
    out = {}
    for name, policy in (("default", Policy(name="default", quotas=quotas)), ("best-fit", Policy(name="best-fit")),
                         ("fifo", Policy(name="fifo"))):
        plan = schedule(snap, jobs, policy, 0.0)
        t = _median_time(lambda p=policy: schedule(snap, jobs, p, 0.0), repeats)
        out[name] = {
            "seconds": t,
            "decisions_per_s": n_jobs / t,
            "placed_jobs": len({p.job_id for p in plan.placements}),
            "pending": len(plan.pending),
            "allocated_gpus": round(sum(
                (p.gpu_fraction_milli / 1000 if p.gpu_fraction_milli else len(p.gpu_uuids)) for p in plan.placements
                if p.mig is None), 1),
        }
    return out


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return (f"{cpu}; {os.cpu_count()} logical CPUs (the core runs on one); Python {platform.python_version()} "
            f"({platform.python_implementation()}); {platform.system()} {platform.release()}")


def _fmt(x: float, digits: int = 3) -> str:
    return f"{x:,.{digits}g}" if abs(x) < 1000 else f"{x:,.0f}"


PLATFORM_BEGIN = "<!-- platform-benchmark:begin -->"
PLATFORM_END = "<!-- platform-benchmark:end -->"


def write_preserving_sections(path: Path, text: str) -> None:
    """Rewrite the file but keep the section `gpupool bench platform` owns (it runs separately: it needs real
    processes and minutes of wall time)."""
    kept = ""
    if path.exists():
        old = path.read_text()
        if PLATFORM_BEGIN in old and PLATFORM_END in old:
            kept = old[old.index(PLATFORM_BEGIN):old.index(PLATFORM_END) + len(PLATFORM_END)]
    path.write_text(text.rstrip() + ("\n\n" + kept + "\n" if kept else "\n"))


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="gpupool bench", description=__doc__.split("\n\n")[0]
                                + " Writes docs/benchmarks.md (or --out).")
    p.add_argument("--out", default=str(DOC), help="markdown file to write (default docs/benchmarks.md)")
    p.add_argument("--repeats", type=int, default=3, help="runs per measurement; the median is reported")
    p.add_argument("--quick", action="store_true", help="smaller sizes (a smoke run; not for the record)")
    p.add_argument("--skip-traces", action="store_true", help="skip the fill and replay sections")
    p.add_argument("--replay-nodes", type=int, default=12, help="nodes in the shrunk replay cluster (default 12)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    n1, n4, jobs = (1024, 4096, 20000) if not args.quick else (128, 256, 2000)
    cmd = "gpupool bench" + (" " + " ".join(argv) if argv else "")
    lines = [
        "# Benchmarks",
        "",
        f"Written by `{cmd}` (`libs/sim/bench.py`). Medians of {args.repeats} runs; every ratio compares policies "
        "run in the same process on the same inputs.",
        "",
        f"Machine: {machine()}.",
        "",
    ]
    print("decisions ...", file=sys.stderr)
    d1 = bench_decisions(n1, jobs, args.repeats)
    print("cycle at scale ...", file=sys.stderr)
    d4 = bench_decisions(n4, jobs, max(1, args.repeats))
    lines += [
        f"## Placement decisions per second ({n1:,} nodes x 8 GPUs, {jobs:,} mixed pending jobs)",
        "",
        "One `schedule(snapshot, pending, policy, now)` call, including building the indexes from the snapshot. "
        "Mix: 50% whole GPUs (1-8, NVLink-local), 15% fractions, 13% MIG slices, 15% gangs (2-4 nodes x 8 or "
        "12/24 GPUs flexible), 7% CPU-only; 5 priority classes, 8 teams (quotas under `default`). Cluster: 70% "
        "exclusive H100 x 8, 15% shareable L40S x 8, 15% A100-80GB x 8 in MIG mode, 16 racks. Target: >= 10,000 "
        "decisions/s on one core.",
        "",
        "| policy | cycle (s) | decisions/s | vs best-fit | jobs placed | left pending |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    base = d1["best-fit"]["seconds"]
    for name, r in d1.items():
        lines.append(f"| {name} | {r['seconds']:.3f} | {r['decisions_per_s']:,.0f} | {base / r['seconds']:.2f}x "
                     f"| {r['placed_jobs']:,} | {r['pending']:,} |")
    lines += [
        "",
        f"## Cycle time at {n4:,} nodes ({n4 * 8:,} GPUs, {jobs:,} pending jobs)",
        "",
        "| policy | cycle (s) | decisions/s | vs best-fit | jobs placed |",
        "| --- | --- | --- | --- | --- |",
    ]
    base = d4["best-fit"]["seconds"]
    for name, r in d4.items():
        lines.append(f"| {name} | {r['seconds']:.3f} | {r['decisions_per_s']:,.0f} | {base / r['seconds']:.2f}x "
                     f"| {r['placed_jobs']:,} |")
    lines.append("")

    have = simcli.DEFAULT_NODES.exists() and simcli.DEFAULT_TASKS.exists() and not args.skip_traces
    if not have:
        lines += ["## Fill experiment and timed replay", "",
                  "Skipped: the openb trace was not found in ../shared/traces (or --skip-traces).", ""]
    else:
        nodes = traces.read_nodes(simcli.DEFAULT_NODES)
        tasks = traces.read_tasks(simcli.DEFAULT_TASKS)
        seeds = (0, 1, 2) if not args.quick else (0,)
        print("fill ...", file=sys.stderr)
        fills = {p: [engine.fill(nodes, tasks, p, s).metrics for s in seeds] for p in ("best-fit", "default", "fifo")}
        med = {p: statistics.median(m["unallocated_gpu_share"] for m in ms) for p, ms in fills.items()}
        gpus = fills["default"][0]["gpus"]
        lines += [
            f"## Fill experiment (openb trace, {len(nodes):,} nodes / {gpus:,} GPUs)",
            "",
            "Tasks sampled from `openb_pod_list_default.csv` arrive until the GPU demand that arrived equals the "
            "cluster's GPU capacity (100% arrived workload); a task that does not fit is dropped. Lower is better. "
            f"Median over seeds {', '.join(map(str, seeds))}.",
            "",
            "| policy | unallocated GPU share at 100% | unallocated GPUs | vs best-fit | per seed |",
            "| --- | --- | --- | --- | --- |",
        ]
        for p in ("best-fit", "fifo", "default"):
            per = ", ".join(f"{m['unallocated_gpu_share'] * 100:.2f}%" for m in fills[p])
            red = (med["best-fit"] - med[p]) / med["best-fit"] if med["best-fit"] else 0.0
            label = "default (gpupool)" if p == "default" else p
            lines.append(f"| {label} | {med[p] * 100:.2f}% | {med[p] * gpus:,.0f} | "
                         f"{'-' if p == 'best-fit' else f'{red * 100:.0f}% fewer'} | {per} |")
        lines += [
            "",
            "Reproduce one figure: `gpupool sim fill --nodes ../shared/traces/alibaba-openb-2023/"
            "openb_node_list_gpu_node.csv --tasks ../shared/traces/alibaba-openb-2023/openb_pod_list_default.csv "
            "--policy best-fit,default,fifo --seed 0 --out out/fill`",
            "",
        ]
        print("replay ...", file=sys.stderr)
        rn = args.replay_nodes
        small = simcli.shrink(traces.read_nodes(simcli.DEFAULT_NODES), rn)
        jobs_ = traces.openb_jobs(tasks, seed=0)
        reps = {}
        for p in ("fifo", "best-fit", "default"):
            t0 = time.perf_counter()
            reps[p] = engine.replay(small, jobs_, p).metrics
            reps[p]["bench_wall_s"] = time.perf_counter() - t0
        g = sum(len(n.gpus) for n in small)
        lines += [
            f"## Timed replay (openb trace on a shrunk cluster: {rn} nodes / {g} GPUs)",
            "",
            f"The {len(jobs_):,} tasks that ran in the trace, at their recorded arrival times and run times "
            f"({reps['fifo']['rejected_never_fit']} that cannot fit this cluster even when empty are rejected at "
            "admission; a preempted task restarts from the beginning); synthetic teams (docs/sim.md). Lower is "
            "better for times; ratios are FIFO / policy.",
            "",
            "| policy | JCT mean (s) | JCT p50 | JCT p99 | queue mean (s) | queue p99 | GPU allocation | Jain | "
            "preemptions | JCT vs FIFO | wall (s) |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        ]
        for p, m in reps.items():
            ratio = reps["fifo"]["jct_mean_s"] / m["jct_mean_s"] if m["jct_mean_s"] else 0.0
            lines.append(
                f"| {p} | {_fmt(m['jct_mean_s'])} | {_fmt(m['jct_p50_s'])} | {_fmt(m['jct_p99_s'])} | "
                f"{_fmt(m['queue_mean_s'])} | {_fmt(m['queue_p99_s'])} | {m['gpu_allocation_rate'] * 100:.1f}% | "
                f"{m['jain_fairness']:.3f} | {m['preemptions']:,} | {ratio:.2f}x | {m['bench_wall_s']:.1f} |")
        lines += [
            "",
            f"Reproduce: `gpupool sim replay --trace ../shared/traces/alibaba-openb-2023/openb_pod_list_default.csv "
            f"--format openb --nodes ../shared/traces/alibaba-openb-2023/openb_node_list_gpu_node.csv "
            f"--max-nodes {rn} --policy default,fifo,best-fit --out out/replay`",
            "",
        ]
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    write_preserving_sections(Path(args.out), "\n".join(lines))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
