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
import csv
import random
import re
import statistics
import sys
import time
from pathlib import Path

from libs.bench.benchdoc import machine
from libs.core import (
    Allocation,
    Gpu,
    JobRequest,
    MigInstance,
    Node,
    Policy,
    Scheduler,
    Snapshot,
    derive_workload,
    schedule,
    teams_quota,
)
from libs.core.schedule import PHASES
from libs.sim import cli as simcli
from libs.sim import engine, fgd, traces

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
                      memory_mib=rng.choice((8192, 65536)),
                      # half declare a run time: their ends make reservations with a known start (backfill)
                      max_runtime_s=rng.choice((3600.0, 14400.0, 86400.0)) if rng.random() < 0.5 else None)
        r = rng.random()
        if r < 0.50:
            kind = rng.choice(("training", "batch", "dev"))
            out.append(JobRequest(gpus=rng.choice((1, 1, 1, 2, 4, 8)), kind=kind, **common))
        elif r < 0.65:
            out.append(JobRequest(gpus=1, gpu_fraction_milli=rng.choice((250, 500, 750)),
                                  gpu_memory_mib=rng.choice((8192, 16384)), kind="dev", **common))
        elif r < 0.78:  # inference replicas: 400 services of a few replicas each, spread over nodes and racks
            out.append(JobRequest(gpus=1, mig_profile=rng.choice(("1g.10gb", "2g.20gb", "3g.40gb")),
                                  kind="inference", replica_group=f"svc-{rng.randrange(400)}", **common))
        elif r < 0.88:
            k = rng.choice((2, 4))
            out.append(JobRequest(gpus=8 * k, gang_nodes=k, gpus_per_node=8, kind="training", **common))
        elif r < 0.93:
            out.append(JobRequest(gpus=rng.choice((12, 24)), gang=True, kind="training", **common))
        else:
            out.append(JobRequest(gpus=0, kind="batch", **common))
    return out


def _median_time(fn, repeats: int) -> tuple[float, float]:
    """Median (CPU seconds of this process, wall seconds) over `repeats` runs. The core runs on one core, so its
    CPU time is what one core spends; wall time on a shared machine also counts waiting for a CPU."""
    cpu, wall = [], []
    for _ in range(repeats):
        c0, t0 = time.process_time(), time.perf_counter()
        fn()
        cpu.append(time.process_time() - c0)
        wall.append(time.perf_counter() - t0)
    return statistics.median(cpu), statistics.median(wall)


def _policies(n_nodes: int) -> tuple[tuple[str, Policy], ...]:
    quotas = teams_quota({t: n_nodes * 8 / len(TEAMS) for t in TEAMS})
    return (("default", Policy(name="default", quotas=quotas)), ("best-fit", Policy(name="best-fit")),
            ("fifo", Policy(name="fifo")))


def bench_decisions(n_nodes: int, n_jobs: int, repeats: int) -> dict:
    nodes = synthetic_cluster(n_nodes)
    snap = Snapshot(tuple(nodes))
    jobs = synthetic_jobs(n_jobs)
    out = {}
    for name, policy in _policies(n_nodes):
        plan = schedule(snap, jobs, policy, 0.0)
        cpu, wall = _median_time(lambda p=policy: schedule(snap, jobs, p, 0.0), repeats)
        # one more run with an injected CPU clock, for the time per phase (the clock reads add a little)
        phases = dict(schedule(snap, jobs, policy, 0.0, clock=time.process_time).stats)
        out[name] = {
            "phases_s": {k: phases.get(f"{k}_us", 0) / 1e6 for k in PHASES + ("build",)},
            "seconds": cpu,
            "wall_s": wall,
            "decisions_per_s": n_jobs / cpu,
            "placed_jobs": len({p.job_id for p in plan.placements}),
            "pending": len(plan.pending),
            "allocated_gpus": round(sum(
                (p.gpu_fraction_milli / 1000 if p.gpu_fraction_milli else len(p.gpu_uuids)) for p in plan.placements
                if p.mig is None), 1),
        }
    return out


def _as_allocations(plan, jobs: dict[str, JobRequest], started_at: float) -> list[Allocation]:
    out = []
    for p in plan.placements:
        j = jobs[p.job_id]
        out.append(Allocation(
            job_id=p.job_id, team=j.team, node=p.node, gpu_uuids=() if p.mig else p.gpu_uuids, started_at=started_at,
            project=j.project, priority_class=j.priority_class, preemptible=j.preemptible,
            gpu_fraction_milli=p.gpu_fraction_milli, gpu_memory_mib=p.gpu_memory_mib,
            mig=((p.gpu_uuids[0], p.mig),) if p.mig else (), cpu_milli=p.cpu_milli, memory_mib=p.memory_mib,
            kind=j.kind, replica_group=j.replica_group, max_runtime_s=j.max_runtime_s))
    return out


def bench_incremental(n_nodes: int, n_jobs: int, repeats: int, finish: int = 200, arrive: int = 100) -> dict:
    """The next cycle after `finish` jobs ended and `arrive` new jobs came: a Scheduler kept across cycles (fed
    `finish(job)`, indexes updated in place) against a full rebuild from a snapshot of what runs (what a stateless
    caller of `schedule()` pays). Two queues: the whole backlog, and only the new arrivals."""
    nodes = synthetic_cluster(n_nodes)
    jobs = synthetic_jobs(n_jobs)
    newcomers = [JobRequest(**{**{f: getattr(j, f) for f in j.__slots__}, "job_id": f"new-{i:05d}",
                               "submitted_at": 3600.0 + i})
                 for i, j in enumerate(synthetic_jobs(arrive, seed=9))]
    by_id = {j.job_id: j for j in jobs + newcomers}
    out = {}
    for name, policy0 in _policies(n_nodes)[:2]:
        policy = Policy(**{f: getattr(policy0, f) for f in policy0.__slots__ if f != "workload"},
                        workload=derive_workload(jobs + newcomers))
        first = Scheduler(Snapshot(tuple(nodes)), policy)
        plan = first.cycle(jobs, 0.0)
        placed = sorted({p.job_id for p in plan.placements})
        gone = set(random.Random(3).sample(placed, min(finish, len(placed))))
        running = [a for a in _as_allocations(plan, by_id, 0.0) if a.job_id not in gone]
        snap = Snapshot(tuple(nodes), running=tuple(running))
        backlog = [j for j in jobs if j.job_id not in set(placed)] + newcomers
        row = {}
        for queue_name, queue in (("backlog", backlog), ("arrivals", newcomers)):
            kept = Scheduler(snap, policy)  # the state after the first cycle, as a long-lived scheduler holds it

            def incremental(kept=kept, queue=queue):
                plan = kept.cycle(queue, 20.0)
                for job_id in sorted({p.job_id for p in plan.placements}):
                    kept.finish(job_id)  # undo, so that every repeat starts from the same state
                return plan

            incremental()  # warm: a kept scheduler has seen this queue before
            row[queue_name] = {
                "jobs": len(queue),
                "kept_s": _median_time(incremental, repeats)[0],
                "rebuild_s": _median_time(lambda q=queue, s=snap, p=policy: schedule(s, q, p, 20.0), repeats)[0],
            }
        out[name] = {"running": len({a.job_id for a in running}), **row}
    return out


def _fmt(x: float, digits: int = 3) -> str:
    return f"{x:,.{digits}g}" if abs(x) < 1000 else f"{x:,.0f}"


PLATFORM_BEGIN = "<!-- platform-benchmark:begin -->"
PLATFORM_END = "<!-- platform-benchmark:end -->"
# sections other commands own (the platform benchmark, the dashboard's, ...): `<!-- NAME:begin -->` .. `:end -->`
_OWNED = re.compile(r"<!-- ([\w.-]+):begin -->.*?<!-- \1:end -->", re.DOTALL)


def write_preserving_sections(path: Path, text: str) -> None:
    """Rewrite the file but keep, byte for byte and in their order, the sections other commands own (e.g. what
    `gpupool bench platform` writes: it runs separately, with real processes and minutes of wall time)."""
    kept = []
    if path.exists():
        kept = [m.group(0) for m in _OWNED.finditer(path.read_text())]
    path.write_text(text.rstrip() + "".join("\n\n" + k for k in kept) + "\n")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="gpupool bench", description=__doc__.split("\n\n")[0]
                                + " Writes docs/benchmarks.md (or --out).")
    p.add_argument("--out", default=str(DOC), help="markdown file to write (default docs/benchmarks.md)")
    p.add_argument("--repeats", type=int, default=3, help="runs per measurement; the median is reported")
    p.add_argument("--quick", action="store_true", help="smaller sizes (a smoke run; not for the record)")
    p.add_argument("--skip-traces", action="store_true", help="skip the fill and replay sections")
    p.add_argument("--replay-nodes", type=int, default=12, help="nodes in the shrunk replay cluster (default 12)")
    return p


FILL_SEEDS = tuple(range(42, 52))  # the FGD artifact's seeds (our draws differ: the same count, not the same tasks)
FILL_POLICIES = ("default", "fgd", "fgd-best-fit", "best-fit")
FGD_REFERENCE = simcli.REPO.parent / "shared" / "reference" / "fgd-atc23" / "default_trace_unallocated_at_100.csv"


def fgd_reference(path: Path) -> dict[str, dict[int, float]]:
    """FGD's published fill results on the default trace (policy -> seed -> unallocated share); {} without the
    file."""
    if not path.exists():
        return {}
    out: dict[str, dict[int, float]] = {}
    with path.open(newline="") as f:
        for row in csv.DictReader(f):
            name = row["sc_policy"].split("-", 1)[-1]
            out.setdefault(name, {})[int(row["seed"])] = float(row["unallocated_pct_at_100"]) / 100
    return out


def fill_section(per_policy: dict[str, dict[int, float]], gpus: int, n_nodes: int,
                 reference: dict[str, dict[int, float]], command: str) -> list[str]:
    """The fill experiment's section of docs/benchmarks.md: every seed of every policy, medians and spreads, and
    FGD's published numbers beside them (same definition)."""
    def row(label: str, by_seed: dict[int, float]) -> str:
        vals = [by_seed[k] for k in sorted(by_seed)]
        med = statistics.median(vals)
        return (f"| {label} | {med * 100:.2f}% | {med * gpus:,.0f} | {min(vals) * 100:.2f}–{max(vals) * 100:.2f}% "
                f"| {', '.join(f'{v * 100:.2f}' for v in vals)} |")

    seeds = sorted(next(iter(per_policy.values())))
    lines = [
        f"## Fill experiment (openb trace, {n_nodes:,} nodes / {gpus:,} GPUs)",
        "",
        "As FGD's artifact measures it (docs/sim.md): every task of `openb_pod_list_default.csv` once in a seeded "
        "shuffle, then random draws to 130% of GPU capacity; a task that does not fit is dropped; the value is the "
        "GPU share left unallocated, averaged over the arrivals at which the arrived workload rounds to 100%. "
        f"Lower is better. Seeds {seeds[0]}–{seeds[-1]}; `fgd-best-fit` is the artifact's BestFit, reimplemented.",
        "",
        "| policy | median | unallocated GPUs | min–max | per seed (%) |",
        "| --- | --- | --- | --- | --- |",
    ]
    for p, by_seed in per_policy.items():
        label = {"default": "default (gpupool)", "fgd": "fgd (gpupool, FGD's typical-request mix)"}.get(p, p)
        lines.append(row(label, by_seed))
    lines += ["", f"Reproduce: `{command}` (one command; `metrics.json` has every seed).", ""]
    if reference:
        lines += [
            "FGD's own results on the same trace and definition (its artifact's "
            "`analysis_allo_discrete.csv`, seeds 42–51; `../shared/reference/fgd-atc23/`):",
            "",
            "| policy | median | unallocated GPUs | min–max | per seed (%) |",
            "| --- | --- | --- | --- | --- |",
        ]
        for name in sorted(reference, key=lambda n: -statistics.median(reference[n].values())):
            lines.append(row(name, reference[name]))
        if "default" in per_policy and "FGD" in reference:
            ours = statistics.median(per_policy["default"].values())
            theirs = statistics.median(reference["FGD"].values())
            verdict = "at or below" if ours <= theirs else "above"
            lines += ["", f"gpupool's `default` median is {abs(ours - theirs) * 100:.2f} points {verdict} FGD's "
                          f"({ours * 100:.2f}% vs {theirs * 100:.2f}%)."]
        lines.append("")
    return lines


def trace_sections(args) -> list[str]:
    nodes = traces.read_nodes(simcli.DEFAULT_NODES)
    tasks = traces.read_tasks(simcli.DEFAULT_TASKS)
    seeds = FILL_SEEDS if not args.quick else FILL_SEEDS[:1]
    print("fill ...", file=sys.stderr)
    per_policy = {p: {s: fgd.fill(nodes, tasks, p, s).metrics["unallocated_gpu_share"] for s in seeds}
                  for p in FILL_POLICIES}
    gpus = sum(1 for n in nodes for g in n.gpus if g.healthy)
    lines = fill_section(per_policy, gpus, len(nodes), fgd_reference(FGD_REFERENCE),
                         f"gpupool sim fill --policy {','.join(FILL_POLICIES)} --seed {seeds[0]} --runs {len(seeds)} "
                         "--out out/fill")
    print("replay ...", file=sys.stderr)
    all_nodes = traces.read_nodes(simcli.DEFAULT_NODES)
    rn = args.replay_nodes
    small = simcli.shrink(all_nodes, rn)
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
        "admission; a preempted task restarts from the beginning); synthetic teams, QoS mapped to classes and "
        "kinds (docs/sim.md). Lower is better for times; ratios are FIFO / policy.",
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
    # the same comparison on other team draws and a smaller cluster, and the default without each of its fixes
    print("replay variants ...", file=sys.stderr)
    scenarios = [(rn, 0), (rn, 1), (rn, 2), (max(2, rn - 2), 0)]
    variants = [
        ("default", {}),
        ("default, no preemption cost", {"preemption_cost": False}),
        ("default, no soft holds", {"drain_after_s": float("inf")}),
        ("default, FGD ties as before (w_binpack 0.01)", {"w_binpack": 0.01}),
    ]
    rows = []
    for n, seed in scenarios:
        cluster = simcli.shrink(all_nodes, n)
        js = traces.openb_jobs(tasks, seed=seed)
        bf = engine.replay(cluster, js, "best-fit").metrics
        for label, over in variants:
            m = engine.replay(cluster, js, "default", policy_overrides=over).metrics
            rows.append((f"{n} nodes, team seed {seed}", label, m, bf))
    lines += [
        "### Default vs best-fit on other draws, and without each fix",
        "",
        "Ratios are default / best-fit on the same cluster and jobs (below 1.00: default is better). In each "
        "scenario the variants remove one change at a time from the default (see \"Why the default was worse\" "
        "below).",
        "",
        "| scenario | policy | queue mean (s) | best-fit queue mean (s) | JCT mean ratio | JCT p99 ratio | "
        "preemptions |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for scen, label, m, bf in rows:
        lines.append(f"| {scen} | {label} | {_fmt(m['queue_mean_s'])} | {_fmt(bf['queue_mean_s'])} | "
                     f"{m['jct_mean_s'] / bf['jct_mean_s']:.3f} | {m['jct_p99_s'] / bf['jct_p99_s']:.2f} | "
                     f"{m['preemptions']:,} |")
    lines += ["", REPLAY_NOTES, ""]
    return lines


REPLAY_NOTES = """### Why the default was worse, and what changed

An earlier default lost this replay to best-fit (JCT p99 140,689 s vs 116,945 s, queue mean 102 s vs 50 s, 31
preemptions). Logging every preemption showed why, and each cause was fixed in the core, not in the simulator:

- **Preemption threw away far more work than it saved.** Preemptors were short "high" (LS) tasks that had waited
  0-30 s; victims were chosen lowest priority first, so a 2-GPU job 616,008 s into a 912,663 s run was restarted
  for a 145 s task, and the same victims were hit again and again. Now victims are chosen by least GPU-time lost
  (the youngest, smallest), and below production-inference priority a job preempts only once its own waiting
  (GPU demand x time waited) has cost as much as its victims' work when it arrived, or after
  `max_preemption_wait_s` (30 min) at most: a ski-rental rule (rent until the rent paid equals the price of
  buying), so short waits that capacity would end by itself never cost a restart. Victims that started after the
  job arrived cost nothing under it. Production inference still preempts at once.
- **Holds for jobs whose start is unknown idled GPUs.** A big job that had waited an hour drained nodes, and no
  trace task declares a run time, so the nodes idled for as long as the unknown work ran: small jobs queued
  behind empty GPUs. Such holds are now soft: other work avoids the held nodes while anything else fits and uses
  them otherwise. Nodes to hold are ranked by a guess that work runs as long again as it has run (the young end
  first). Holds with a declared end stay hard, with backfill.
- **FGD's near-ties were left to chance.** Beside FGD's fragmentation score, the packing weight was 0.01; on some
  draws the replay's 8-GPU jobs then waited far longer than under best-fit (the "w_binpack 0.01" rows). At 0.03
  FGD still decides (one GPU of fragmentation outweighs any packing difference) and packing settles the
  near-ties.
- The replay's guarantees now split the capacity in proportion to each synthetic team's GPU demand (equal shares
  made the 40% team borrow most of the time and be reclaimed over and over), and openb QoS maps to job kinds.

What the ablation says: the preemption-cost rule mostly protects JCT (mean and p99; without it more jobs restart)
and on some draws costs a little mean queueing; soft holds matter on draws where a big job starves; the packing
weight matters most. What remains: preemption and reclaim still restart some jobs (the preemptions column), the
mean JCT is within 0.3% of best-fit's rather than below it, the (earlier, legacy-definition) fill experiment's
lead over best-fit went from 43% to 39% (the packing weight and the QoS-to-kind mapping each move one seed by about
0.4 points), and the mean queueing is decided by a handful of 8-GPU jobs, so single draws move it by tens of
seconds.

Measured again in December 2026 (the rows above; the previous rows predated the scarce-host rule of docs/sim.md
and a preempted run's stale finish no longer waking a cycle), and the conclusions above no longer all hold. On
team seeds 0 and 2 and on 10 nodes `default` still queues less than `best-fit` (21.5 s, 37.8 s, 16.4 s against
49.8 s and 44.5 s), mean JCT within 0.4%. On team seed 1 it does not: 193 s against 49.8 s, JCT p99 1.17x (docs/sim.md
saw the same draw when the scarce-host rule came in: 8-GPU jobs wait longer there; not investigated further). The
preemption-cost rule still cuts restarts (6 against 14, 4 against 29, 10 against 18) and protects the p99 on seed
2 (1.00 against 1.19); soft holds now move nothing by more than a second; the old packing weight (0.01) is now
better on seeds 0 and 1 (17.3 s, 50.7 s) and worse on seed 2 (42.1 s), so "the packing weight matters most" stands
but no longer in favour of 0.03 on every draw. Left open.

Measured again on 2026-12-06 after CPU-only ties to busy nodes and the uncut typical mix (docs/sim.md, "CPU-only
ties to busy nodes, and the whole mix"; the rows above). Team seed 1 no longer starves its 8-GPU jobs: 46.2 s
against best-fit's 49.8 s (it was 193 s, JCT p99 1.17x, now 1.00x). `default` queues less than `best-fit` on all
four draws (15.1, 46.2, 36.0, 19.1 s against 49.8 and 44.5 s) with mean JCT within 0.4%; on team seed 0 its JCT
p99 is 1.07x (125,581 s against 116,945 s: one long job restarted later). The preemption-cost rule still cuts
restarts (8 against 21, 6 against 20, 5 against 27, 5 against 24) and protects the p99 (1.00 against 1.14 and
1.19 on seeds 1 and 2). The old packing weight (0.01) is now worse on seed 1 (86.9 s) and 10 nodes (22.8 s).
Another draw of this size does regress: 10 nodes, team seed 2 (docs/sim.md, "Scarce hosts": 190 s against 33 s
before), where 8-GPU jobs needing 88 cores wait behind long work on the few nodes able to hold them. Left open."""


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    n1, n4, jobs = (1024, 4096, 20000) if not args.quick else (128, 256, 2000)
    cmd = "gpupool bench" + (" " + " ".join(argv) if argv else "")
    lines = [
        "# Benchmarks",
        "",
        f"Written by `{cmd}` (`libs/bench/core.py`). Medians of {args.repeats} runs; every ratio compares policies "
        "run in the same process on the same inputs.",
        "",
        f"Machine: {machine()}; the core runs on one CPU.",
        "",
    ]
    print("decisions ...", file=sys.stderr)
    d1 = bench_decisions(n1, jobs, args.repeats)
    print("cycle at scale ...", file=sys.stderr)
    d4 = bench_decisions(n4, jobs, max(1, args.repeats))
    print("incremental ...", file=sys.stderr)
    inc = bench_incremental(n1, jobs, args.repeats)
    lines += [
        f"## Placement decisions per second ({n1:,} nodes x 8 GPUs, {jobs:,} mixed pending jobs)",
        "",
        "One `schedule(snapshot, pending, policy, now)` call, including building the indexes from the snapshot. "
        "Mix: 50% whole GPUs (1-8, NVLink-local; training, batch or dev), 15% fractions (dev), 13% MIG slices "
        "(inference replicas of 400 services, spread over nodes and racks), 15% training gangs (2-4 nodes x 8 or "
        "12/24 GPUs flexible), 7% CPU-only batch; half declare a max runtime; 5 priority classes, 8 teams "
        "(quotas under `default`). Cluster: "
        "70% exclusive H100 x 8, 15% shareable L40S x 8, 15% A100-80GB x 8 in MIG mode, 16 racks. Target: "
        ">= 10,000 decisions/s on one core. Seconds are CPU seconds of the process (`time.process_time`), i.e. "
        "what the one core spends; wall seconds beside them also count waiting for a CPU on this shared machine.",
        "",
        "| policy | cycle, CPU (s) | decisions/s | wall (s) | CPU vs best-fit | jobs placed | left pending |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    base = d1["best-fit"]["seconds"]
    for name, r in d1.items():
        lines.append(f"| {name} | {r['seconds']:.3f} | {r['decisions_per_s']:,.0f} | {r['wall_s']:.3f} | "
                     f"{r['seconds'] / base:.2f}x | {r['placed_jobs']:,} | {r['pending']:,} |")
    lines += [
        "",
        "### Where a cycle's time goes",
        "",
        "The same cycle once more with an injected clock (`schedule(..., clock=time.process_time)`: the core "
        "itself never reads a clock), CPU milliseconds per phase as reported in `Plan.stats` (`<phase>_us`). "
        "`build` is the index build from the snapshot (part of `normalize` for the one-shot `schedule`); "
        "`place` is filter -> score -> select; `reasons` diagnoses why a blocked job waits.",
        "",
        "| policy | " + " | ".join(PHASES) + " | of which build | total |",
        "| --- | " + " | ".join("---" for _ in PHASES) + " | --- | --- |",
    ]
    for name, r in d1.items():
        ph = r["phases_s"]
        lines.append(f"| {name} | " + " | ".join(f"{ph[k] * 1000:,.0f}" for k in PHASES)
                     + f" | {ph['build'] * 1000:,.0f} | {sum(ph[k] for k in PHASES) * 1000:,.0f} |")
    lines += [
        "",
        f"## Cycle time at {n4:,} nodes ({n4 * 8:,} GPUs, {jobs:,} pending jobs)",
        "",
        "| policy | cycle, CPU (s) | decisions/s | wall (s) | CPU vs best-fit | jobs placed |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    base = d4["best-fit"]["seconds"]
    for name, r in d4.items():
        lines.append(f"| {name} | {r['seconds']:.3f} | {r['decisions_per_s']:,.0f} | {r['wall_s']:.3f} | "
                     f"{r['seconds'] / base:.2f}x | {r['placed_jobs']:,} |")
    lines += [
        "",
        f"## Incremental indexes vs a full rebuild ({n1:,} nodes)",
        "",
        "After the first cycle above, 200 jobs finish and 100 new jobs arrive. The next cycle in a `Scheduler` "
        "kept across cycles (fed `finish(job)`: each change moves one node between index groups) against "
        "`schedule()` on a snapshot of what runs (every index rebuilt). The simulator keeps one `Scheduler` for a "
        "whole replay. Two queues: the whole backlog, and only the new arrivals (a busy service's usual cycle, "
        "where the rebuild dominates). CPU seconds, medians; the kept scheduler's time includes undoing its "
        "placements after each repeat.",
        "",
        "| policy | running jobs | queue | jobs | kept scheduler (s) | rebuilt from snapshot (s) | rebuild / kept |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, r in inc.items():
        for q in ("arrivals", "backlog"):
            row = r[q]
            lines.append(f"| {name} | {r['running']:,} | {q} | {row['jobs']:,} | {row['kept_s']:.3f} | "
                         f"{row['rebuild_s']:.3f} | {row['rebuild_s'] / row['kept_s']:.1f}x |")
    lines.append("")

    have = simcli.DEFAULT_NODES.exists() and simcli.DEFAULT_TASKS.exists() and not args.skip_traces
    if not have:
        lines += ["## Fill experiment and timed replay", "",
                  "Skipped: the openb trace was not found in ../shared/traces (or --skip-traces).", ""]
    else:
        lines += trace_sections(args)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    write_preserving_sections(Path(args.out), "\n".join(lines))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
