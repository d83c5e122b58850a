"""`gpupool bench replay`: the compressed timed replay of the openb trace (issue #18): reclaim churn, fairness per
time window and the simulator's own speed, per policy; writes its own section of docs/benchmarks.md.

Compressing the arrivals 10x onto a shrunk cluster keeps a deep queue of fractional-GPU jobs waiting most of the
time, so teams borrow and guarantees are reclaimed all the time: the setting where reclaim churn showed (thousands
of reclaim preemptions) and where `default` replayed far slower than `best-fit`.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

from libs.bench.benchdoc import machine, write_section
from libs.bench.core import DOC, _fmt
from libs.sim import cli as simcli
from libs.sim import engine, traces

BEGIN = "<!-- replay-churn:begin -->"
END = "<!-- replay-churn:end -->"
POLICIES = ("default", "best-fit", "fifo")
HYSTERESIS = {"reclaim_min_runtime_s": engine.RECLAIM_MIN_RUNTIME_S}  # the ablation row: reclaim hysteresis on


NOTES = """### Reclaim churn: what it is, and a hysteresis tried

`default` reclaims thousands of times on this replay. Logging every reclaim (first 1,500 jobs): the victims were
a median 60 s into their runs (best-effort's minimum runtime) and single jobs were reclaimed up to 81 times. In a
deep queue every waiting job has waited longer than any borrower has run, so the ski-rental rule prices every
borrower at nothing (its work started after the preemptor arrived) and a team under its guarantee takes the GPU
back as soon as the borrower may be preempted; the borrower requeues, borrows the next free GPU, and is reclaimed
again.

`Policy.reclaim_min_runtime_s` makes borrowed work reclaimable only after it ran that long. On the first 3,000
jobs of this replay (`engine.replay(..., policy_overrides={"reclaim_min_runtime_s": X})`) it looked like a win:

| reclaim_min_runtime_s | reclaim preemptions | GPU-h lost (reclaim / all) | JCT mean (s) | fair share mean | hours below 0.8 | CPU (s), before the last speed-up |
| --- | --- | --- | --- | --- | --- | --- |
| 0 | 1,417 | 122 / 358 | 126,223 | 0.927 | 12.7% | 44.2 |
| 300 | 1,144 | 172 / 418 | 122,130 | 0.950 | 9.9% | 41.3 |
| 600 | 997 | 180 / 419 | 124,106 | 0.946 | 10.4% | 38.9 |
| 900 | 949 | 237 / 464 | 122,661 | 0.949 | 10.2% | 38.7 |
| 1800 | 927 | 319 / 536 | 140,652 | 0.850 | 23.2% | 41.6 |
| 0, with a 10% deficit threshold (a trial, not kept) | 1,043 | 95 / 299 | 128,718 | 0.884 | 18.3% | 45.8 |

On the whole replay (the table above, last row) 600 s is mixed: 6% fewer reclaims (2,963 against 3,153), a mean
JCT 0.9% higher, as many hours below 0.8 (16.9%), and the work reclaims throw away up by half (847 GPU-hours
against 573: each victim is older when it goes) while all preemptions together throw away 14% less (1,231
against 1,424). Both rows moved against the previous table (3,001 reclaims, JCT 276,099 s): `default` now scores
against FGD's typical requests with scarce hosts (docs/sim.md), and earlier core changes were not bisected. The
number of reclaims mostly follows the number of times borrowers start on capacity a waiting team is guaranteed,
not when they are taken back, so `default` keeps the core's 0 (no work thrown away for it) and the knob stays for
operators who value steadier guarantees over lost work. The Jain index barely moves in any of these; the hourly
ratios do.

Replay speed: plans are unchanged by the speed-ups (the pinned replay and a plan-equality test hold): admission
and the guarantee test are remembered per quota-ledger version, a job just like one turned away with nothing
changed since gets that answer again (since December 2026 from the first of its kind: a failed preemption search
records how many candidates it weighed, so every look-alike says the same, and the second full answer per kind
and placement is gone: 715,084 full answers on the first 3,000 jobs became 452,764), preemption searches skip
nodes (and quotas) where no set of victims could make room, preemption candidates are kept per cycle, a quota
preemption search first tries every candidate gone at once, the ledger sums siblings' lending once per version,
the deep-queue walk does less per job, whether a job holds reserved nodes is a lookup, and a one-node job is
tried on held nodes (diagnosis, soft holds) only when one of them has room. One change of the model, not of
plans: the replay used to rerun the whole cycle at once after each preemption, starting the preemptor with no
delay and costing one more walk over the deep queue per preemption (1.45x `best-fit`'s cycles); the preemptor now
starts at the next cycle, as on the platform after its victims' grace period (docs/sim.md, Timed replay), which
moved `default`'s row (mean JCT 272,114 s -> 268,388 s, 3,521 -> 3,229 preemptions). The CPU column is the fairer
figure when the machine is shared, but on this 2-vCPU virtual machine even CPU seconds drift by a fifth within
minutes (the same `best-fit` replay took 72.6 to 107 s of CPU in one session; here `default`'s row took more
than its own hysteresis variant, which does more work): back-to-back pairs of the same code in the same session
gave `default` 2.12x, 2.23x and 2.53x `best-fit`'s CPU, a single run of each 2.66x; hence `--repeat N`, which
replays the pair N times back to back and takes medians (the per-round column). The 2x target is not shown."""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="gpupool bench replay", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=str(DOC), help="markdown file whose section to write (default docs/benchmarks.md)")
    p.add_argument("--max-nodes", type=int, default=12, help="nodes of the shrunk cluster (default 12)")
    p.add_argument("--time-scale", type=float, default=0.1,
                   help="multiply submit times by this (default 0.1: arrivals compressed 10x)")
    p.add_argument("--limit", type=int, default=0, help="replay only the first N jobs (0: all; a smoke run)")
    p.add_argument("--repeat", type=int, default=1,
                   help="rounds of default and best-fit back to back (default 1): CPU as the median over rounds, "
                        "the ratio as the median of each round's own; the plans must be equal every round")
    p.add_argument("--no-ablation", action="store_true",
                   help="skip the row of `default` with reclaim hysteresis (reclaim_min_runtime_s=600)")
    return p


PAIRED = ("default", "best-fit")  # the pair whose CPU ratio is the target: replayed `repeat` times, back to back


def rows(nodes, jobs, ablation: bool, repeat: int = 1) -> list[tuple[str, dict]]:
    """One replay per policy (and the ablation), and `repeat` rounds of `PAIRED` back to back: the plans are the
    same every round (checked), their CPU seconds are not — each round's go into `cpu_runs`, `cpu_s` is the median,
    and the ratio to best-fit is the median of the rounds' own ratios (a drifting machine moves both of a round)."""
    out: dict[str, dict] = {}
    for r in range(repeat):
        for p in POLICIES if r == 0 else PAIRED:
            print(f"replay {p} (round {r + 1} of {repeat if p in PAIRED else 1}) ...", file=sys.stderr)
            m = engine.replay(nodes, jobs, p).metrics
            first = out.setdefault(p, {**m, "cpu_runs": []})
            if (m["jct_mean_s"], m["preemptions"], m["cycles"]) != (first["jct_mean_s"], first["preemptions"],
                                                                   first["cycles"]):
                raise RuntimeError(f"replay of {p} differed between rounds: the simulator is not deterministic")
            first["cpu_runs"].append(m["cpu_s"])
    for m in out.values():
        m["cpu_s"] = statistics.median(m["cpu_runs"])
    results = [(p, out[p]) for p in POLICIES]
    if ablation:
        print("replay default with reclaim hysteresis ...", file=sys.stderr)
        m = engine.replay(nodes, jobs, "default", policy_overrides=HYSTERESIS).metrics
        results.append((f"default, reclaim hysteresis {engine.RECLAIM_MIN_RUNTIME_S:g} s", {**m, "cpu_runs": [m["cpu_s"]]}))
    return results


def cpu_ratio(m: dict, base: dict) -> float:
    """The median over rounds of this policy's CPU over best-fit's in the same round (one round: the plain ratio)."""
    if len(m["cpu_runs"]) < 2 or len(m["cpu_runs"]) != len(base["cpu_runs"]):
        return m["cpu_s"] / base["cpu_s"]
    return statistics.median(a / b for a, b in zip(m["cpu_runs"], base["cpu_runs"], strict=True))


def section(results: list[tuple[str, dict]], command: str, gpus: int, n_nodes: int, n_jobs: int,
            time_scale: float) -> str:
    base = dict(results).get("best-fit", results[0][1])
    lines = [
        BEGIN,
        f"## Compressed replay: reclaim churn, fairness over time, replay speed ({n_nodes} nodes / {gpus} GPUs, "
        f"arrivals x{time_scale:g})",
        "",
        f"`{command}` (`libs/bench/replay.py`). The {n_jobs:,} openb tasks that ran, submit times multiplied "
        f"by {time_scale:g} onto {n_nodes} nodes: a deep queue, mostly fractional GPUs, so teams borrow and "
        "guarantees are reclaimed all the time. Synthetic teams and demand-proportional guarantees as in docs/sim.md; "
        "every policy's fairness is measured against the same guarantees. Machine: " + machine() + ".",
        "",
        "Churn: preemptions to reclaim a guarantee, all preemptions, GPU-hours of work they threw away (a preempted "
        "job restarts from scratch), jobs preempted twice or more. Fairness: per hour of replay time, each team's "
        "GPU time over its entitlement (its guarantee, or its demand when it wants less; capped at 1), over every "
        "(hour, team): mean, worst, and the share below 0.8. Lower is better for times and churn.",
        "",
        "| policy | JCT mean (s) | JCT p99 | queue mean (s) | reclaim preemptions | all preemptions | "
        "GPU-h lost (reclaim / all) | jobs preempted 2+ | fair share mean | worst | hours below 0.8 | Jain | "
        "wall (s) | CPU (s) | CPU vs best-fit | CPU per round (s) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, m in results:
        f = m["fair_share_windows"]
        lines.append(
            f"| {name} | {_fmt(m['jct_mean_s'])} | {_fmt(m['jct_p99_s'])} | {_fmt(m['queue_mean_s'])} | "
            f"{m['reclaim_preemptions']:,} | {m['preemptions']:,} | {m['reclaim_work_lost_gpu_h']:,.0f} / "
            f"{m['work_lost_gpu_h']:,.0f} | {m['jobs_preempted_twice_or_more']:,} | {f['mean_ratio']:.3f} | "
            f"{f['worst_ratio']:.2f} | {f['share_below'] * 100:.1f}% | {m['jain_fairness']:.3f} | "
            f"{m['wall_s']:.1f} | {m['cpu_s']:.1f} | {cpu_ratio(m, base):.2f}x | "
            f"{', '.join(f'{c:.1f}' for c in m['cpu_runs'])} |")
    lines += ["", NOTES, "", END]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.repeat < 1:
        print("gpupool bench replay: --repeat must be at least 1", file=sys.stderr)
        return 2
    if not (simcli.DEFAULT_NODES.exists() and simcli.DEFAULT_TASKS.exists()):
        print("gpupool bench replay: the openb trace is not in ../shared/traces", file=sys.stderr)
        return 2
    nodes = simcli.shrink(traces.read_nodes(simcli.DEFAULT_NODES), args.max_nodes)
    ns = argparse.Namespace(format="openb", trace=simcli.DEFAULT_TASKS, seed=0, limit=args.limit,
                            time_scale=args.time_scale)
    jobs = simcli.load_jobs(ns)
    results = rows(nodes, jobs, not args.no_ablation, args.repeat)
    cmd = "gpupool bench replay" + (" " + " ".join(argv) if argv else "")
    text = section(results, cmd, sum(len(n.gpus) for n in nodes), len(nodes), len(jobs), args.time_scale)
    write_section(Path(args.out), BEGIN, END, text)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
