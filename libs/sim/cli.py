"""`gpupool sim`: replay traces and run the fill experiment through the scheduling core.

    gpupool sim fill   --nodes NODES.csv --tasks TASKS.csv --policy P --seed S [--runs N] --out DIR
    gpupool sim replay --trace TRACE.csv --format openb|generic --nodes NODES.csv --policy P --out DIR

`--policy` takes one of fifo, best-fit, default, fgd, or several separated by commas (compared in one run: the first
one's numbers are the top-level keys of metrics.json, all of them are under "policies"). The fill experiment is
measured as FGD's artifact measures it (libs/sim/fgd.py; `--definition legacy`: the earlier one, engine.fill), where
`fgd-best-fit` is also accepted: the artifact's BestFit baseline.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from libs.sim import engine, fgd, plots, traces

REPO = Path(__file__).resolve().parents[2]
OPENB = REPO.parent / "shared" / "traces" / "alibaba-openb-2023"
DEFAULT_NODES = OPENB / "openb_node_list_gpu_node.csv"
DEFAULT_TASKS = OPENB / "openb_pod_list_default.csv"


def _default(path: Path) -> str | None:
    return str(path) if path.exists() else None


def _policies(value: str, known: tuple[str, ...] = engine.POLICIES) -> list[str]:
    names = [v.strip() for v in value.split(",") if v.strip()]
    for n in names:
        if n not in known:
            raise argparse.ArgumentTypeError(f"unknown policy {n!r}; choose from {', '.join(known)}")
    if not names:
        raise argparse.ArgumentTypeError("no policy given")
    return names


def _fill_policies(value: str) -> list[str]:
    return _policies(value, engine.POLICIES + fgd.BASELINES)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpupool sim",
        description="Run gpupool's scheduling core on traces: the fill experiment (fragmentation) and timed\n"
                    "replays. Every plan is verified by an in-memory applier. Writes DIR/metrics.json and PNG plots.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="{fill,replay}")

    f = sub.add_parser(
        "fill",
        help="submit tasks sampled from a trace until the cluster is full; measure unallocated GPUs",
        description="The fill experiment of Weng et al. (ATC'23), measured as its artifact does: every task of "
                    "TASKS once in a seeded shuffle, then random draws until the arrived GPU demand is --tune x "
                    "capacity, arrive one by one into the cluster of NODES and never leave; a task that does not "
                    "fit (CPU, memory and GPU demand must all fit one node) is dropped. The value is the share of "
                    "GPUs left unallocated, averaged over the arrivals at which the arrived workload rounds to "
                    "100%. With --runs N, seeds S..S+N-1, each policy's median (and min, max, every seed). "
                    "metrics.json: unallocated_gpu_share (a fraction; the first policy's median), per policy under "
                    "\"policies\", and the first seed's curve. --definition legacy: sampled with replacement until "
                    "--max-arrived, read at the end.",
    )
    f.add_argument("--nodes", default=_default(DEFAULT_NODES), required=not DEFAULT_NODES.exists(),
                   help="node list CSV (sn|name,cpu_milli,memory_mib,gpu,model); default: the openb GPU node list "
                        "in ../shared/traces when present")
    f.add_argument("--tasks", default=_default(DEFAULT_TASKS), required=not DEFAULT_TASKS.exists(),
                   help="task CSV with name,cpu_milli,memory_mib,num_gpu,gpu_milli (gpu_spec honoured when "
                        "present); default: the openb pod list in ../shared/traces when present")
    f.add_argument("--policy", type=_fill_policies, default=["default"],
                   help="fifo | best-fit | default | fgd | fgd-best-fit (FGD's BestFit baseline; fgd definition "
                        "only), or a comma-separated list to compare (default: default)")
    f.add_argument("--seed", type=int, default=0, help="seed of the task order and draws (default 0)")
    f.add_argument("--runs", type=int, default=1, help="seeds --seed .. --seed+N-1; medians reported (default 1)")
    f.add_argument("--out", required=True, help="output directory (created if missing)")
    f.add_argument("--definition", choices=("fgd", "legacy"), default="fgd",
                   help="fgd: as FGD's artifact measures it (default); legacy: gpupool's earlier definition")
    f.add_argument("--tune", type=float, default=fgd.TUNE,
                   help="fgd definition: top up with random draws to this multiple of capacity (default 1.3)")
    f.add_argument("--max-arrived", type=float, default=1.0,
                   help="legacy definition: stop when the arrived GPU demand reaches this multiple of capacity "
                        "(default 1.0)")
    f.add_argument("--sharing", choices=("fractional", "exclusive"), default="fractional",
                   help="sharing mode of every GPU (default fractional: openb is a GPU-sharing trace)")

    r = sub.add_parser(
        "replay",
        help="replay a trace on a virtual clock; JCT, queueing, allocation, fragmentation, fairness",
        description="Timed replay: jobs arrive at their submit time, run for their duration, may be preempted "
                    "(and restart) by the default policy, and the scheduler runs a cycle at most every "
                    "--cycle-interval seconds of virtual time. metrics.json: jct_mean_s, jct_p99_s, queue_mean_s, "
                    "queue_p99_s, gpu_allocation_rate, jain_fairness, preemptions and more.",
    )
    r.add_argument("--trace", default=_default(DEFAULT_TASKS), required=not DEFAULT_TASKS.exists(),
                   help="trace CSV; default: the openb pod list in ../shared/traces when present")
    r.add_argument("--format", choices=("openb", "generic"), default="openb",
                   help="openb: Alibaba GPU trace v2023 pod list; generic: submit_time,duration,gpus,gpu_model,"
                        "team,priority[,...] (see docs/sim.md)")
    r.add_argument("--nodes", default=_default(DEFAULT_NODES), required=not DEFAULT_NODES.exists(),
                   help="node list CSV (sn|name,cpu_milli,memory_mib,gpu,model)")
    r.add_argument("--policy", type=_policies, default=["default"],
                   help="fifo | best-fit | default | fgd, or a comma-separated list to compare (default: default)")
    r.add_argument("--out", required=True, help="output directory (created if missing)")
    r.add_argument("--seed", type=int, default=0, help="seed of the synthetic team assignment (default 0)")
    r.add_argument("--max-nodes", type=int, default=0,
                   help="shrink the cluster to this many nodes, taken evenly over the node list (0: all)")
    r.add_argument("--limit", type=int, default=0, help="replay only the first N jobs by submit time (0: all)")
    r.add_argument("--time-scale", type=float, default=1.0,
                   help="multiply submit times by this factor (< 1 compresses arrivals; default 1)")
    r.add_argument("--cycle-interval", type=float, default=30.0,
                   help="seconds of virtual time between scheduling cycles at most (default 30)")
    r.add_argument("--sharing", choices=("fractional", "exclusive"), default="fractional",
                   help="sharing mode of every GPU (default fractional)")
    # the top-level help lists every option of every command too (generated: it cannot drift from them)
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = "\n".join(_options_summary(sub))
    return parser


def _options_summary(sub) -> list[str]:
    out = ["commands (stable command lines; see also `gpupool sim COMMAND --help`):"]
    for name, sp in sub.choices.items():
        out += ["", f"  gpupool sim {name} {' '.join(sp.format_usage().split()[4:])}"]
        for a in sp._actions:
            if not a.option_strings or a.dest == "help":
                continue
            value = "{" + ",".join(a.choices) + "}" if a.choices else (a.metavar or a.dest.upper())
            out.append(f"    {a.option_strings[0]} {value}: {a.help}")
    return out


def shrink(nodes: list, n: int) -> list:
    if n <= 0 or n >= len(nodes):
        return nodes
    step = len(nodes) / n
    return [nodes[int(i * step)] for i in range(n)]


def _one_fill(args, nodes: list, tasks: list, policy: str, seed: int) -> engine.FillResult:
    if args.definition == "legacy":
        return engine.fill(nodes, tasks, policy, seed, max_arrived=args.max_arrived)
    return fgd.fill(nodes, tasks, policy, seed, tune=args.tune)


def run_fill(args) -> dict:
    if args.runs < 1:
        raise ValueError("--runs must be at least 1")
    if args.definition == "legacy" and set(args.policy) & set(fgd.BASELINES):
        raise ValueError("fgd-best-fit is FGD's baseline: it goes with --definition fgd")
    nodes = traces.read_nodes(args.nodes, sharing=args.sharing)
    tasks = traces.read_tasks(args.tasks)
    seeds = list(range(args.seed, args.seed + args.runs))
    runs = {p: {s: _one_fill(args, nodes, tasks, p, s) for s in seeds} for p in args.policy}
    per_policy = {}
    for p, by_seed in runs.items():
        shares = {s: r.metrics["unallocated_gpu_share"] for s, r in by_seed.items()}
        per_policy[p] = {**by_seed[seeds[0]].metrics, "unallocated_gpu_share": statistics.median(shares.values()),
                         "min": min(shares.values()), "max": max(shares.values()),
                         "seeds": {str(s): v for s, v in shares.items()}, "runs": len(seeds)}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    metrics = {**per_policy[args.policy[0]], "definition": args.definition, "policies": per_policy,
               "command": "gpupool sim fill", "nodes_file": str(args.nodes), "tasks_file": str(args.tasks)}
    if "best-fit" in per_policy and "default" in per_policy:
        bf = per_policy["best-fit"]["unallocated_gpu_share"]
        gp = per_policy["default"]["unallocated_gpu_share"]
        metrics["default_vs_best_fit_reduction"] = (bf - gp) / bf if bf else 0.0
    (out / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
    plots.fill_curve({p: by_seed[seeds[0]] for p, by_seed in runs.items()}, out)
    return metrics


def load_jobs(args) -> list[traces.SimJob]:
    if args.format == "openb":
        jobs = traces.openb_jobs(traces.read_tasks(args.trace), seed=args.seed)
    else:
        jobs = traces.read_generic(args.trace, seed=args.seed)
    jobs.sort(key=lambda j: (j.submit, j.job_id))
    if args.limit > 0:
        jobs = jobs[: args.limit]
    if args.time_scale != 1.0 and jobs:
        t0 = jobs[0].submit
        jobs = [traces.SimJob(_retime(j.request, t0 + (j.submit - t0) * args.time_scale), j.duration)
                for j in jobs]
    return jobs


def _retime(req, t):
    from dataclasses import replace

    return replace(req, submitted_at=t)


def run_replay(args) -> dict:
    nodes = shrink(traces.read_nodes(args.nodes, sharing=args.sharing), args.max_nodes)
    jobs = load_jobs(args)
    results = {p: engine.replay(nodes, jobs, p, cycle_interval=args.cycle_interval) for p in args.policy}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    first = results[args.policy[0]].metrics
    metrics = {**first, "policies": {p: r.metrics for p, r in results.items()},
               "command": "gpupool sim replay", "trace_file": str(args.trace), "format": args.format}
    (out / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
    plots.replay_plots(results, out)
    return metrics


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        metrics = run_fill(args) if args.command == "fill" else run_replay(args)
    except (OSError, ValueError, KeyError) as e:
        print(f"gpupool sim: error: {e}", file=sys.stderr)
        return 2
    keys = ("unallocated_gpu_share",) if args.command == "fill" else (
        "jct_mean_s", "jct_p99_s", "queue_mean_s", "queue_p99_s", "gpu_allocation_rate", "jain_fairness",
        "preemptions")
    for name, m in metrics["policies"].items():
        print(name + ": " + ", ".join(f"{k}={m[k]:.4g}" for k in keys))
    print(f"wrote {Path(args.out) / 'metrics.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
