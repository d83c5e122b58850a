"""What the pool was used for and what it cost: `gpupool usage` (the GPU-seconds ledger), `gpupool report usage |
efficiency | capacity | waste` (JSON, table or --csv; capacity lives in capacity.py) and `gpupool cost-rates list |
set | delete`."""

from __future__ import annotations

import argparse
from datetime import UTC, datetime
from typing import Any

from libs.cli import capacity
from libs.cli.common import EXIT_OK, JOB_KINDS, Adder, UsageError, parse_when, report_range
from libs.cli.render import emit, fixed, fmt_time, num, range_line, raws, report_out, report_table, table
from libs.client import GpupoolClient

REPORT_DIMENSIONS = ("team", "project", "user", "kind", "gpu_model", "sharing", "mig_profile")


def cmd_usage(args: argparse.Namespace, gp: GpupoolClient) -> int:
    records = gp.list_usage(team=args.team, job_id=args.job)

    def render() -> str:
        if not records:
            return "No usage recorded."
        rows: list[list[Any]] = [[u.job_id, u.team, u.project, u.gpu_model, u.gpu_count, round(u.gpu_seconds),
                                  u.started_at, u.ended_at, u.release_reason] for u in records]
        total = sum(u.gpu_seconds for u in records)
        return (table(["JOB", "TEAM", "PROJECT", "MODEL", "GPUS", "GPU-SECONDS", "STARTED", "ENDED", "REASON"],
                      rows)
                + f"\n\ntotal: {total:.0f} GPU-seconds ({total / 3600:.2f} GPU-hours) in {len(records)} "
                  "allocation(s)")

    emit(args, raws(records), render)
    return EXIT_OK


def _report_filters(args: argparse.Namespace) -> dict[str, list[str]]:
    return {dim: values for dim in REPORT_DIMENSIONS if (values := getattr(args, f"f_{dim}", None))}


def _group_by(args: argparse.Namespace) -> list[str] | None:
    if args.group_by is None:
        return None
    dims = [d.strip() for d in args.group_by.split(",") if d.strip()]
    unknown = [d for d in dims if d not in REPORT_DIMENSIONS]
    if unknown:
        raise UsageError(f"unknown --group-by {', '.join(unknown)} (use {', '.join(REPORT_DIMENSIONS)})")
    return dims


def cmd_report_usage(args: argparse.Namespace, gp: GpupoolClient) -> int:
    start, end = report_range(args)
    kw = dict(group_by=_group_by(args), filters=_report_filters(args), limit=args.limit)
    report = gp.report_usage(start, end, **kw)

    def render() -> str:
        dims = report.group_by
        rows = [[*(r.dims(dims).values()), fixed(r.gpu_hours), fixed(r.gpu_seconds, 1), fixed(r.cost, 2),
                 fixed(r.avg_utilization_pct, 1), r.allocations, r.jobs] for r in report.rows]
        head = [d.upper().replace("_", "-") for d in dims]
        total = report.total
        body = report_table([*head, "GPU-HOURS", "GPU-SECONDS", f"COST ({report.currency})", "UTIL%", "ALLOCS",
                             "JOBS"], rows) if rows else "No usage in this range."
        foot = (f"\n\ntotal: {fixed(total.gpu_hours)} GPU-hours, {fixed(total.cost, 2)} {report.currency}"
                + (f" ({fixed(total.unpriced_gpu_seconds, 1)} GPU-seconds without a price)"
                   if total and total.unpriced_gpu_seconds else "")
                + f" · {range_line(report)}" + (" · more groups than --limit" if report.truncated else "")) \
            if total else ""
        return body + foot

    report_out(args, report.raw, lambda: gp.report_usage_csv(start, end, **kw), render)
    return EXIT_OK


def cmd_report_efficiency(args: argparse.Namespace, gp: GpupoolClient) -> int:
    start, end = report_range(args)
    kw = dict(group_by=_group_by(args), filters=_report_filters(args), limit=args.limit)
    report = gp.report_efficiency(start, end, **kw)

    def render() -> str:
        dims = report.group_by
        rows = [[*(r.dims(dims).values()), fixed(r.allocated_gpu_hours), fixed(r.used_gpu_hours),
                 fixed(r.idle_gpu_hours), fixed(r.efficiency_pct, 1), fixed(r.idle_pct, 1),
                 fixed(r.telemetry_coverage_pct, 1)] for r in report.rows]
        head = [d.upper().replace("_", "-") for d in dims]
        body = report_table([*head, "ALLOCATED-H", "USED-H", "IDLE-H", "EFFICIENCY%", "IDLE%", "MEASURED%"],
                            rows) if rows else "No usage in this range."
        return body + f"\n\n{range_line(report)}; idle = minutes at or below {report.idle_util_pct}% utilization"

    report_out(args, report.raw, lambda: gp.report_efficiency_csv(start, end, **kw), render)
    return EXIT_OK


def cmd_report_waste(args: argparse.Namespace, gp: GpupoolClient) -> int:
    start, end = report_range(args)
    kw = dict(filters=_report_filters(args), min_idle_fraction=args.min_idle_fraction, limit=args.limit)
    report = gp.report_waste(start, end, **kw)

    def render() -> str:
        parts = [f"idle GPU-hours: {fixed(report.idle_gpu_hours)} · {range_line(report)}"]
        if report.by_team:
            parts.append(report_table(["TEAM", "ALLOCATED-H", "IDLE-H", "IDLE%"], [
                [r.raw.get("team"), fixed(r.allocated_gpu_hours), fixed(r.idle_gpu_hours), fixed(r.idle_pct, 1)]
                for r in report.by_team]))
        if report.idle_allocations:
            parts.append(f"allocations idle at least {report.min_idle_fraction:.0%} of the measured time:\n"
                         + report_table(["ALLOCATION", "JOB", "TEAM", "USER", "KIND", "NODE", "MODEL", "GPUS",
                                         "IDLE-H", "IDLE%", "UTIL%", "STATE"], [
                             [a.allocation_id, a.job_id, a.team, a.user, a.kind, a.node, a.gpu_model,
                              num(a.gpu_share), fixed(a.idle_gpu_hours), fixed(100 * a.idle_fraction, 1),
                              fixed(a.avg_utilization_pct, 1),
                              "running" if a.running else (a.release_reason or "released")]
                             for a in report.idle_allocations]))
        else:
            parts.append("No idle allocations.")
        if report.orphans:
            parts.append("orphans:\n" + report_table(["GPU", "NODE", "ORPHAN", "ALLOCATION", "TEAM", "PIDS", "SINCE"], [
                [o.gpu_uuid, o.node, o.orphan, o.allocation_id, o.team, o.pids, o.since] for o in report.orphans]))
        return "\n\n".join(parts)

    report_out(args, report.raw, lambda: gp.report_waste_csv(start, end, **kw), render)
    return EXIT_OK


def cmd_cost_rates_list(args: argparse.Namespace, gp: GpupoolClient) -> int:
    rates = gp.list_cost_rates(gpu_model=args.model)
    emit(args, raws(rates), lambda: report_table(
        ["MODEL", "MIG-PROFILE", "FROM", "PRICE/HOUR", "SET-BY"],
        [[r.gpu_model, r.mig_profile, r.effective_from, f"{r.price_per_hour:g}", r.set_by] for r in rates])
        if rates else "No prices set.")
    return EXIT_OK


def cmd_cost_rates_set(args: argparse.Namespace, gp: GpupoolClient) -> int:
    rate = gp.set_cost_rate(args.model, args.price, parse_when(args.start) if args.start else datetime.now(UTC),
                            mig_profile=args.mig_profile or "")
    what = f"{rate.gpu_model}{' ' + rate.mig_profile if rate.mig_profile else ''}"
    emit(args, rate.raw, lambda: f"{what}: {rate.price_per_hour:g} per "
                                 f"{'instance' if rate.mig_profile else 'GPU'}-hour from {fmt_time(rate.effective_from)}")
    return EXIT_OK


def cmd_cost_rates_delete(args: argparse.Namespace, gp: GpupoolClient) -> int:
    gp.delete_cost_rate(args.model, parse_when(args.start), mig_profile=args.mig_profile or "")
    emit(args, None, lambda: f"price of {args.model} from {args.start} withdrawn")
    return EXIT_OK


def _window(p: argparse.ArgumentParser, default: str) -> None:
    p.add_argument("--from", dest="start", metavar="WHEN",
                   help=f"start: 2026-03-01, 2026-03-01T08:00Z, or an age like 7d (default: {default} before --to)")
    p.add_argument("--to", dest="end", metavar="WHEN", help="end, exclusive (default: now)")
    fmt = p.add_mutually_exclusive_group()
    fmt.add_argument("--csv", action="store_true", help="print the report's table as CSV (for a spreadsheet)")
    fmt.add_argument("--json", action="store_true", help="print the report as JSON (same as -o json)")


def _filters(p: argparse.ArgumentParser) -> None:
    for dim, flag in (("team", "--team"), ("project", "--project"), ("user", "--user"), ("kind", "--kind"),
                      ("gpu_model", "--model"), ("sharing", "--sharing"), ("mig_profile", "--mig-profile")):
        p.add_argument(flag, dest=f"f_{dim}", action="append", metavar=dim.upper(),
                       choices=JOB_KINDS if dim == "kind" else ("whole", "fraction", "mig")
                       if dim == "sharing" else None, help=f"only this {dim.replace('_', ' ')} (repeatable)")


def register(sub: argparse._SubParsersAction, add: Adder) -> None:
    """`gpupool usage`, `gpupool report usage|efficiency|capacity|waste` (and capacity's `gpupool history export`)
    and `gpupool cost-rates list|set|delete`."""
    p = add("usage", cmd_usage, "the GPU-seconds ledger")
    p.add_argument("--team")
    p.add_argument("--job", help="one job's usage")

    report = sub.add_parser("report", help="usage and cost, efficiency, capacity, waste",
                            description="reports from the accounting ledger")
    rsub = report.add_subparsers(dest="report_command", required=True, metavar="{usage,efficiency,capacity,waste}")
    for name, func, text in (("usage", cmd_report_usage, "GPU-hours and cost per team, project, user, kind, model "
                                                          "or sharing"),
                             ("efficiency", cmd_report_efficiency, "used vs allocated GPU-hours and idle GPU-hours")):
        p = add(name, func, text, rsub)
        _window(p, "7 days")
        p.add_argument("--group-by", metavar="DIMS",
                       help=f"comma-separated, any of {','.join(REPORT_DIMENSIONS)} (default team; '' for a total)")
        _filters(p)
        p.add_argument("--limit", type=int, help="at most this many groups (largest first)")
    capacity.register(sub, rsub, add, _window)
    p = add("waste", cmd_report_waste, "idle GPU-hours by team, idle allocations by name, and orphans", rsub)
    _window(p, "7 days")
    _filters(p)
    p.add_argument("--min-idle-fraction", type=float, metavar="F",
                   help="list allocations idle at least this fraction of the time (0-1, default 0.5)")
    p.add_argument("--limit", type=int, help="at most this many allocations and orphans")

    rates = sub.add_parser("cost-rates", help="prices per GPU model and MIG profile, with effective dates",
                           description="prices per GPU model and MIG profile, with effective dates")
    csub = rates.add_subparsers(dest="rates_command", required=True, metavar="{list,set,delete}")
    p = add("list", cmd_cost_rates_list, "every price and when it takes effect", csub)
    p.add_argument("--model", help="only this GPU model")
    p = add("set", cmd_cost_rates_set, "set a price from a date (admins)", csub)
    p.add_argument("model", metavar="MODEL")
    p.add_argument("price", metavar="PRICE", help="per GPU-hour (per instance-hour with --mig-profile)")
    p.add_argument("--from", dest="start", metavar="WHEN", help="when it takes effect (default: now)")
    p.add_argument("--mig-profile", help="price one MIG profile of the model, e.g. 3g.40gb")
    p = add("delete", cmd_cost_rates_delete, "withdraw a price (admins)", csub)
    p.add_argument("model", metavar="MODEL")
    p.add_argument("--from", dest="start", metavar="WHEN", required=True, help="the date the price takes effect")
    p.add_argument("--mig-profile")
