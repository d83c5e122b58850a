"""Capacity planning in the CLI: `gpupool report capacity` (demand against supply, the numeric forecast, and a
what-if on the platform's own history) and `gpupool history export` (the recorded jobs as a trace `gpupool sim
replay --format generic` reads).

The what-if runs here, client-side: the simulator is a library (libs/sim) and a replay of a month of history is
heavy work that has no place in a service. It replays the history on the platform's own pool (every node from
GET /v1/nodes, lost ones left out) with more or fewer nodes of one GPU model at a time, and finds the smallest
count that keeps the p90 queue wait of the jobs that model served under the target (libs/sim/whatif.py).
"""

from __future__ import annotations

import argparse
import json
import re
from collections import Counter
from collections.abc import Callable, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from libs.cli.common import EXIT_OK, Adder, UsageError, parse_duration, report_range, run_api
from libs.cli.render import fixed, fmt_duration, fmt_time, range_line, report_out, report_table
from libs.client import GpupoolClient

WHAT_IF = re.compile(r"^p90-wait=(?P<value>\S+)$")


def _wait(seconds: float | None) -> str | None:
    """Queue waits are often sub-second: show tenths below a minute."""
    if seconds is None or seconds >= 60:
        return fmt_duration(seconds)
    return f"{seconds:.1f}s"


def parse_what_if(text: str) -> float:
    """`p90-wait=600` or `p90-wait=10m`: the target p90 queue wait, in seconds."""
    match = WHAT_IF.match(text.strip())
    if not match:
        raise UsageError(f"--what-if {text!r}: use p90-wait=SECONDS or a duration, e.g. p90-wait=600 or p90-wait=10m")
    value = match.group("value")
    seconds = float(value) if re.fullmatch(r"\d+(\.\d+)?", value) else parse_duration(value)
    if seconds < 0:
        raise UsageError("--what-if: the target wait must not be negative")
    return seconds


# --- history as a trace -------------------------------------------------------------------------------------------
def trace_rows(items: Sequence[dict[str, Any]]) -> tuple[list[dict[str, Any]], Counter]:
    """The history export's jobs as rows of the generic trace (libs/sim/traces.HISTORY_COLUMNS). A job with
    replicas becomes one row per replica (`<job>#r<i>`, one replica group). Jobs never granted have no run time to
    replay: they are left out and counted by state."""
    rows: list[dict[str, Any]] = []
    skipped: Counter = Counter()
    for j in items:
        if j.get("duration_s") is None:
            skipped[j.get("state") or "unknown"] += 1
            continue
        copies = 1 if j.get("gang_nodes") else max(1, int(j.get("replicas") or 1))
        base = {
            "submit_time": j["submit_time"], "duration": j["duration_s"], "gpus": j["gpus"],
            "gpu_model": "|".join(j.get("gpu_models") or []), "team": j["team"], "priority": j.get("priority", 0),
            "priority_class": j.get("priority_class") or "", "kind": j.get("kind") or "batch",
            "project": j.get("project") or "default",
            "gpu_milli": j.get("gpu_fraction_milli") or "", "mig_profile": j.get("mig_profile") or "",
            "gang_nodes": j.get("gang_nodes") or "", "gpus_per_node": j.get("gpus_per_node") or "",
            "max_runtime_s": j.get("max_runtime_s"), "start_time": j.get("start_time"),
            "end_time": j.get("end_time"), "wait_s": j.get("wait_s"), "gpu_model_granted": j.get("gpu_model_granted"),
            "state": j.get("state")}
        for i in range(copies):
            rows.append({**base, "job_id": j["job_id"] if copies == 1 else f"{j['job_id']}#r{i}",
                         "replica_group": j["job_id"] if copies > 1 else ""})
    return rows, skipped


def export_history(gp: GpupoolClient, start: datetime | None, end: datetime | None, teams: Sequence[str] | None,
                   out: Path) -> dict[str, Any]:
    from libs.sim.traces import write_history

    items = gp.history_jobs(start, end, teams=teams)
    rows, skipped = trace_rows(items)
    written = write_history(out, rows)
    return {"file": str(out), "jobs": len(items), "rows": written, "skipped": dict(sorted(skipped.items()))}


def cmd_history_export(args: argparse.Namespace, gp: GpupoolClient) -> int:
    start, end = report_range(args)
    summary = export_history(gp, start, end, args.team, Path(args.out))

    def render() -> str:
        skipped = ", ".join(f"{n} {state}" for state, n in summary["skipped"].items())
        return (f"wrote {summary['rows']} trace rows ({summary['jobs']} jobs) to {summary['file']}"
                + (f"; left out, never started: {skipped}" if skipped else "")
                + f"\nreplay it: gpupool sim replay --format generic --trace {summary['file']} --nodes NODES.csv "
                  "--out DIR")

    if args.output == "json":
        print(json.dumps(summary, indent=2))
    else:
        print(render())
    return EXIT_OK


# --- the what-if -----------------------------------------------------------------------------------------------
def pool_nodes(gp: GpupoolClient) -> list[Any]:
    """The platform's pool as the simulator's nodes: every node not lost, each GPU with its model, memory and
    sharing mode (CPU and memory are not limited: a history does not record what jobs asked of them)."""
    from libs.core.model import Gpu, Node

    nodes = []
    for n in gp.list_nodes():
        if n.state == "lost" or not n.gpus:
            continue
        name = f"{n.cluster}/{n.node}"
        gpus = tuple(Gpu(f"{name}/gpu{g.index}", g.index, g.model, g.memory_mib,
                         sharing=g.sharing if g.sharing in ("exclusive", "fractional", "mig") else "exclusive")
                     for g in sorted(n.gpus, key=lambda g: g.index))
        nodes.append(Node(name, n.cluster, gpus))
    return sorted(nodes, key=lambda n: n.name)


def what_if(nodes: list[Any], history: Path, target_s: float, models: Sequence[str] | None, *,
            policy: str = "default", cycle_interval: float = 1.0, max_nodes: int | None = None) -> dict[str, Any]:
    """Per GPU model of the pool (or `models`): today's size, the smallest size whose replay of the history keeps
    the p90 wait of the jobs that model served at or under `target_s`, and every size tried."""
    from libs.sim import whatif
    from libs.sim.traces import read_history

    jobs, served = read_history(history)
    today = Counter(whatif.model_of(n) for n in nodes)
    gpus_today = Counter({m: sum(len(n.gpus) for n in nodes if whatif.model_of(n) == m) for m in today})
    out = []
    for model in sorted(models or today):
        if model not in today:
            raise UsageError(f"the pool has no {model} nodes")
        best, trials = whatif.smallest_pool(nodes, jobs, served, model, target_s, max_nodes=max_nodes,
                                            policy=policy, cycle_interval=cycle_interval)
        out.append({"gpu_model": model, "nodes_now": today[model], "gpus_now": gpus_today[model],
                    "answer": best.view() if best else None, "trials": [t.view() for t in trials]})
    return {"target_p90_wait_s": target_s, "history": str(history), "jobs": len(jobs), "policy": policy,
            "cycle_interval_s": cycle_interval, "models": out}


def what_if_text(result: dict[str, Any]) -> str:
    rows, answers = [], []
    for m in result["models"]:
        for t in m["trials"]:
            rows.append([m["gpu_model"], t["nodes"], t["gpus"], t["jobs"], t["unplaced"],
                         _wait(t["p90_wait_s"]) if t["p90_wait_s"] is not None else "never", "yes" if t["ok"] else
                         "no"])
        a = m["answer"]
        answers.append(f"{m['gpu_model']}: {a['gpus']} GPUs ({a['nodes']} nodes; today {m['gpus_now']})" if a else
                       f"{m['gpu_model']}: more than {max(t['gpus'] for t in m['trials'])} GPUs "
                       f"(today {m['gpus_now']}); try --max-nodes")
    target = _wait(result["target_p90_wait_s"])
    return (f"what-if: the smallest pool per model that keeps the p90 wait at or under {target}, replaying "
            f"{result['jobs']} jobs of {result['history']} (policy {result['policy']}):\n"
            + report_table(["MODEL", "NODES", "GPUS", "JOBS", "UNPLACED", "P90-WAIT", "OK"], rows)
            + "\n\n" + "\n".join(answers))


# --- `gpupool report capacity` --------------------------------------------------------------------------------------
def capacity_text(report: Any) -> str:
    rows, numbers = [], []
    for m in report.models:
        d, f = m.demand, m.forecast
        when = fmt_time(f.exceeds_supply_at) if f.exceeds_supply_at else ""
        rows.append([m.gpu_model, m.supply_gpus, fixed(d.peak_demand_gpus, 1), fixed(d.peak_allocated_gpus, 1),
                     fixed(d.queued_gpu_hours, 2), fixed(d.pending_gpus, 1), _wait(d.wait_p50_s),
                     _wait(d.wait_p90_s), _wait(d.wait_p99_s), f"{f.status} {when}".strip()])
        week, month = f.horizon(7), f.horizon(30)
        if f.slope_gpus_per_day is not None and week and month and week.peak_gpus is not None:
            numbers.append([m.gpu_model, f.fit, f.points, fixed(f.slope_gpus_per_day, 3), fixed(f.level_gpus, 1),
                            fixed(week.peak_gpus, 1), f"{week.peak_low_gpus:.1f}-{week.peak_high_gpus:.1f}",
                            fixed(month.peak_gpus, 1), f"{month.peak_low_gpus:.1f}-{month.peak_high_gpus:.1f}"])
        else:
            numbers.append([m.gpu_model, f.fit, f.points, fixed(f.slope_gpus_per_day, 3), "-", "-", "-", "-", "-"])
    if not rows:
        return "No GPUs and no demand."
    body = report_table(["MODEL", "SUPPLY", "PEAK-DEMAND", "PEAK-ALLOC", "QUEUED-H", "PENDING", "WAIT-P50",
                         "WAIT-P90", "WAIT-P99", "FORECAST"], rows)
    forecast = report_table(["MODEL", "FIT", "POINTS", "GPUS/DAY", "LEVEL", "PEAK-7D", "80%-7D", "PEAK-30D",
                             "80%-30D"], numbers)
    scope = f" · demand of team {report.team}" if report.team else ""
    return (body + "\n\nforecast of peak demand (GPUs), from one point per bucket:\n" + forecast
            + f"\n\n{range_line(report)} · trend per {fmt_duration(report.bucket_s)}{scope}")


def cmd_report_capacity(args: argparse.Namespace, gp: GpupoolClient) -> int:
    start, end = report_range(args)
    target = parse_what_if(args.what_if) if args.what_if else None
    if args.history and target is None:
        raise UsageError("--history goes with --what-if p90-wait=SECONDS")
    if target is not None and args.csv:
        raise UsageError("--csv prints the report's table only: use --json (or the table) with --what-if")
    kw = dict(bucket_s=int(parse_duration(args.bucket)) if args.bucket else None, gpu_model=args.model,
              team=args.team)
    report = gp.report_capacity(start, end, **kw)
    result = None
    if target is not None:
        history = Path(args.history) if args.history else None
        if history is None:  # the live export of the report's own range
            import tempfile

            history = Path(tempfile.mkdtemp(prefix="gpupool-history-")) / "history.csv"
            export_history(gp, start, end, [args.team] if args.team else None, history)
        result = what_if(pool_nodes(gp), history, target, [args.model] if args.model else None,
                         policy=args.policy, cycle_interval=args.cycle_interval, max_nodes=args.max_nodes)

    def render() -> str:
        return capacity_text(report) + ("\n\n" + what_if_text(result) if result else "")

    raw = {**report.raw, "what_if": result} if result is not None else report.raw
    report_out(args, raw, lambda: gp.report_capacity_csv(start, end, **kw), render)
    return EXIT_OK


def register(sub: argparse._SubParsersAction, rsub: argparse._SubParsersAction, add: Adder,
             window: Callable[[argparse.ArgumentParser, str], None]) -> None:
    """`gpupool report capacity` (under `rsub`) and `gpupool history export` (under `sub`)."""
    from libs.sim.engine import POLICIES

    p = add("capacity", cmd_report_capacity,
            "per GPU model: demand against supply, trend, a numeric forecast, and a what-if on the history", rsub)
    window(p, "30 days")
    p.add_argument("--bucket", metavar="DURATION", help="trend bucket, e.g. 1h or 1d (default 1d); the forecast "
                                                       "fits one point per bucket")
    p.add_argument("--model", help="only this GPU model")
    p.add_argument("--team", help="only this team's demand")
    p.add_argument("--what-if", metavar="p90-wait=SECONDS",
                   help="replay the history on the pool scaled per model and find the smallest GPU count that keeps "
                        "the p90 queue wait at or under SECONDS (or a duration: p90-wait=10m)")
    p.add_argument("--history", metavar="FILE", help="the history trace to replay (`gpupool history export`); "
                                                     "default: export the report's range now")
    p.add_argument("--policy", choices=POLICIES, default="default", help="the simulator's policy (default default)")
    p.add_argument("--cycle-interval", type=float, default=1.0, metavar="S",
                   help="seconds of virtual time between scheduling cycles at most (default 1)")
    p.add_argument("--max-nodes", type=int, metavar="N",
                   help="try at most N nodes of a model (default: twice today's)")

    history = sub.add_parser("history", help="the platform's recorded jobs, e.g. as a trace the simulator replays",
                             description="the platform's recorded jobs")
    hsub = history.add_subparsers(dest="history_command", required=True, metavar="{export}")
    p = hsub.add_parser("export", parents=[add.common],
                        help="write the jobs that entered the queue in a range as a generic trace CSV",
                        description="write the jobs that entered the queue in a range as a generic trace CSV "
                                    "(`gpupool sim replay --format generic` reads it; see docs/sim.md)")
    p.set_defaults(func=run_api(cmd_history_export))
    p.add_argument("--since", "--from", dest="start", metavar="WHEN",
                   help="from: 2026-03-01, 2026-03-01T08:00Z, or an age like 30d (default: 30 days before --to)")
    p.add_argument("--to", dest="end", metavar="WHEN", help="until, exclusive (default: now)")
    p.add_argument("--team", action="append", help="only this team's jobs (repeatable)")
    p.add_argument("--out", required=True, metavar="FILE", help="the trace CSV to write")
