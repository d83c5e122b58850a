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
jobs of this replay (`engine.replay(..., policy_overrides={"reclaim_min_runtime_s": X})`; measured again in
December 2026 after a preempted run's stale finish stopped waking a cycle, see Replay speed):

| reclaim_min_runtime_s | reclaim preemptions | GPU-h lost (reclaim / all) | JCT mean (s) | fair share mean | hours below 0.8 | CPU (s) |
| --- | --- | --- | --- | --- | --- | --- |
| 0 | 1,321 | 150 / 358 | 135,036 | 0.882 | 18.8% | 38.0 |
| 300 | 1,268 | 192 / 432 | 129,407 | 0.926 | 13.2% | 35.9 |
| 600 | 842 | 196 / 457 | 131,706 | 0.872 | 20.1% | 28.3 |
| 900 | 964 | 253 / 491 | 142,652 | 0.850 | 23.1% | 32.9 |
| 1800 | 878 | 339 / 548 | 131,412 | 0.951 | 10.0% | 33.8 |

Before that change the same sweep looked like a clean win up to 900 s (1,417 reclaims at 0 down to 949 at 900 s,
JCT and fairness a little better); now fewer reclaims still come with more work thrown away (each victim is older
when it goes), and JCT and the hourly fairness move both ways from one setting to the next. A trial with a 10%
deficit threshold on reclaim (measured before that change: 1,043 reclaims, JCT 128,718 s, 18.3% of hours below
0.8) was not kept. On the whole replay (the table above, last row) 600 s was mixed (35% fewer reclaims, 1,795
against 2,769, but a mean JCT 2.8% higher and 38% more work thrown away by reclaims); since CPU-only ties to busy
nodes and the uncut typical mix (docs/sim.md; measured 2026-12-06) it loses outright: more reclaims (3,058 against
2,606), a mean JCT 9.7% higher, more hours below 0.8 (10.0% against 6.0%), and more than twice the work reclaims
throw away (1,080 GPU-hours against 464). The number of reclaims mostly follows the number of times borrowers start on capacity a waiting team is
guaranteed, not when they are taken back, so `default` keeps the core's 0 (no work thrown away for it) and the
knob stays for operators who value steadier guarantees over lost work. The Jain index barely moves in any of
these; the hourly ratios do.

### Replay speed

Plans are unchanged by the speed-ups (the pinned replay and plan-equality tests hold): admission and the guarantee
test are remembered per quota-ledger version (the ledger also answers per models' entries and amount, and without
quota entries at once), a job just like one turned away with nothing changed since gets that answer again (a failed
preemption search records how many candidates it weighed, so every look-alike says the same: 715,084 full answers
on the first 3,000 jobs became 452,764), preemption candidates are looked up before a search is set up (most
searches have none), a quota preemption search remembers its candidates and the admission without each per ledger
version and skips releases no node could use (7,333 of 7,333 checks on the first 3,000 jobs), preemption searches
skip nodes where no set of victims could make room, the fair-share order hands the cycle runs of one team's jobs
(it compares with the next team only when that one could go first), whether a job holds reserved nodes is a
lookup, and a one-node job is tried on held nodes only when one of them has room.

Two changes of the model, not of the core, each re-pinned in its commit (docs/sim.md, Timed replay). The replay
used to rerun the whole cycle at once after each preemption, starting the preemptor with no delay and costing one
more walk over the deep queue per preemption; the preemptor now starts at the next cycle, as on the platform after
its victims' grace period (mean JCT 272,114 s -> 268,388 s, 3,521 -> 3,229 preemptions). And the finish a
preempted run had been due at stayed in the event heap and woke a cycle although nothing had happened (the job was
back in the queue; the platform has no such event): on the first 3,000 jobs 918 of 5,660 cycles (16%) ran only
for such stale finishes. They are gone: `default` replays in 11,385 cycles instead of 13,674 (-17%; mean JCT
268,388 s -> 273,746 s, 3,229 -> 3,163 preemptions, hours below 0.8 17.2% -> 10.7%); policies that never preempt
replay exactly as before.

The 2x target is met: on 2026-12-06, after CPU-only ties to busy nodes and the uncut typical mix, one round took
1.55x `best-fit`'s CPU (166.1 s against 107.5 s, the table above; on the first 3,000 jobs the new rule costs 6%
more CPU than the old, 55.6 s against 52.6 s), and the rule moved `default`'s replay the right way: mean JCT
273,746 -> 263,346 s, p99 1,069,185 -> 933,735 s, reclaims 2,769 -> 2,606, hours below 0.8 10.7% -> 6.0%. Before
it, `default` took a median 1.65x `best-fit`'s CPU (rounds 2.02x, 1.62x, 1.65x). Of that, the core's speed-ups alone brought it to 2.08x (the same command before the stale finishes went: 167.4 s
against 80.5 s, rounds 2.39x/1.95x/2.08x) and dropping the stale cycles the rest; a concurrent pair on separate
cores gave 1.70x (145.1 s against 85.2 s). The CPU column is the fairer figure when the machine is shared, but on
this 2-vCPU virtual machine even CPU seconds drift by a fifth within minutes (`best-fit` alone took 77.6 to 94.8 s
here, and one round of the pair still came out at 2.02x): hence `--repeat N`, which replays the pair N times back
to back and takes the median of the rounds' own ratios. What is left is structural: `default` still runs 9% more
cycles than `best-fit` (11,385 against 10,443: preemptors wake a cycle of their own) and each blocked job's
answer there also weighs quota, victims and reservations."""


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
