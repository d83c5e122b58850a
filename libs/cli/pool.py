"""The pool and its nodes: `gpupool nodes | pool | top` for everyone, and the operators' `gpupool node | cordon |
uncordon | drain | sharing | gpu-health | orphans`."""

from __future__ import annotations

import argparse
import json
import select
import shutil
import sys
import termios
import time
import tty
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

from libs.cli.common import EXIT_OK, Adder, UsageError
from libs.cli.render import cell, emit, fmt_age, fmt_gib, key_values, num, raws, table
from libs.client import GpupoolClient, GpupoolError
from libs.client.models import Allocation, Job, Node, NodeNetwork, NodeStorage, Pool

USED_UTIL_PCT = 5.0  # a GPU counts as "used" above this utilization
CLEAR = "\x1b[H\x1b[2J"


_NIC_KINDS = {"infiniband": "IB", "ethernet": "Eth"}


def fmt_speed(mbps: int | None) -> str:
    """400000 → "400G", 2500 → "2.5G", 100 → "100M", None → "?" (a link that is down or unknown)."""
    if mbps is None:
        return "?"
    if mbps < 1000:
        return f"{mbps}M"
    return f"{num(round(mbps / 1000, 1))}G"


def fmt_network(net: NodeNetwork) -> str | None:
    """A node's NICs grouped by kind and speed, fastest first: "8×400G IB, 2×100G Eth"; None without NICs."""
    groups: dict[tuple[int, str], int] = {}
    for nic in net.interfaces:
        key = (nic.speed_mbps if nic.speed_mbps is not None else -1, nic.kind)
        groups[key] = groups.get(key, 0) + 1
    parts = [f"{count}×{fmt_speed(None if speed < 0 else speed)} {_NIC_KINDS.get(kind, kind)}"
             for (speed, kind), count in sorted(groups.items(), key=lambda kv: (-kv[0][0], kv[0][1]))]
    return ", ".join(parts) or None


def fmt_tib(gib: float | None) -> str:
    if gib is None:
        return "-"
    tib = gib / 1024
    return f"{tib:.1f}" if tib >= 0.1 or tib == 0 else f"{tib:.2g}"


def fmt_storage(st: NodeStorage) -> str | None:
    """Used over total across a node's volumes, in TiB: "1.2/27.8 TiB" ("-/27.8 TiB" before any sample); None
    without volumes."""
    if not st.volumes:
        return None
    return f"{fmt_tib(st.used_gib)}/{fmt_tib(st.total_gib)} TiB"


def nodes_table(nodes: Sequence[Node]) -> str:
    if not nodes:
        return "No nodes."
    rows = []
    for n in nodes:
        healthy = sum(1 for g in n.gpus if g.health == "healthy")
        models = sorted({g.model for g in n.gpus})
        state = n.state + (" (drained)" if n.drained else " (cordoned)" if n.cordoned else "")
        rows.append([n.cluster, n.node, state, len(n.gpus), healthy, models,
                     n.cpu_util_pct, fmt_network(n.network), fmt_storage(n.storage),
                     fmt_age(n.last_seen_at) + " ago" if n.last_seen_at else None])
    return table(["CLUSTER", "NODE", "STATE", "GPUS", "HEALTHY", "MODELS", "CPU %", "NETWORK", "STORAGE",
                  "LAST SEEN"], rows)


def cmd_nodes(args: argparse.Namespace, gp: GpupoolClient) -> int:
    nodes = gp.list_nodes(cluster=args.cluster)
    emit(args, raws(nodes), lambda: nodes_table(nodes))
    return EXIT_OK


def pool_rows(pool: Pool) -> list[dict[str, Any]]:
    """One row per (cluster, GPU model) from GET /v1/pool, in the CLI's columns (`used` is the gateway's
    `in_use`: utilization above its threshold in fresh telemetry)."""
    rows = []
    for c in sorted(pool.clusters, key=lambda c: c.cluster):
        for m in sorted(c.models, key=lambda m: m.model or ""):
            rows.append({"cluster": c.cluster, "model": m.model, "total": m.total, "allocated": m.allocated,
                         "used": m.in_use, "allocated_idle": m.allocated_idle, "unhealthy": m.unhealthy,
                         "free": m.free})
    return rows


def pool_table(summary: Sequence[dict[str, Any]]) -> str:
    if not summary:
        return "No GPUs."
    cols = ("total", "allocated", "used", "allocated_idle", "unhealthy", "free")
    rows = [[r["cluster"], r["model"], *(r[c] for c in cols)] for r in summary]
    if len(summary) > 1:
        rows.append(["all", "", *(sum(r[c] for r in summary) for c in cols)])
    return table(["CLUSTER", "MODEL", "TOTAL", "ALLOCATED", "USED", "ALLOC-IDLE", "UNHEALTHY", "FREE"], rows)


def cmd_pool(args: argparse.Namespace, gp: GpupoolClient) -> int:
    if args.fragmentation:
        frag = gp.fragmentation(cluster=args.cluster)
        emit(args, frag.raw, lambda: fragmentation_text(frag))
        return EXIT_OK
    pool = gp.pool(cluster=args.cluster)
    emit(args, pool.raw, lambda: pool_table(pool_rows(pool)))
    return EXIT_OK


def fragmentation_text(frag: Any) -> str:
    rows = table(("CLUSTER", "MODEL", "GPUS", "FREE", "FRAGMENTED", "SHARE"),
                 [(r.cluster, r.gpu_model, r.gpus, f"{r.free_gpus:g}", f"{r.fragmented_gpus:.2f}",
                   f"{100 * r.fragmented_share:.0f}%") for r in frag.rows])
    def shape(w: Any) -> str:
        size = f"{w.gpu_milli / 1000:g} GPU" if w.gpu_milli < 1000 else f"{w.gpus} GPU{'s' * (w.gpus > 1)}"
        return f"{size}{' of ' + '/'.join(w.gpu_models) if w.gpu_models else ''} {100 * w.share:.0f}%"

    mix = ", ".join(shape(w) for w in frag.workload) or "none (nothing asked for recently)"
    return f"{rows}\nrecent workload: {mix}"


def top_rows(nodes: Sequence[Node], allocs: Sequence[Allocation], jobs: Sequence[Job]) -> list[dict[str, Any]]:
    holder = {g.uuid: a for a in allocs if a.active for g in a.gpus}
    names = {j.job_id: j for j in jobs}
    rows = []
    for n in nodes:
        for g in sorted(n.gpus, key=lambda g: g.index):
            t = g.telemetry
            a = holder.get(g.uuid)
            job = names.get(a.job_id) if a else None
            rows.append({
                "cluster": n.cluster, "node": n.node, "index": g.index, "model": g.model,
                "util_pct": t.utilization_gpu_pct if t else None,
                "memory_used_mib": t.memory_used_mib if t else None, "memory_total_mib": g.memory_mib,
                "temperature_c": t.temperature_c if t else None, "power_w": t.power_w if t else None,
                # the health state the API gives (healthy, suspect, quarantined, probation), as `gpupool node` shows
                "health": g.state, "job_id": a.job_id if a else None, "team": a.team if a else None,
                "job_name": job.name if job else None,
            })
    return rows


TOP_SORTS = ("node", "util", "mem", "temp", "power", "health", "team")
TOP_FILTERS = ("all", "allocated", "idle", "unhealthy")


@dataclass(frozen=True)
class TopView:
    """What the live view shows: sorted by `sort` (reversed: highest first), only the `only` rows, and only rows
    that contain `match` (in node, model, health, team, job id or name; case-insensitive)."""

    sort: str = "node"
    reverse: bool = False
    only: str = "all"
    match: str = ""


def top_key(view: TopView, key: str) -> TopView | None:
    """A key pressed in the live view: s next sort, r reverse, a/i/u only allocated / allocated-idle / unhealthy
    (again: all), c clear; None: quit (q)."""
    if key == "q":
        return None
    if key == "s":
        return replace(view, sort=TOP_SORTS[(TOP_SORTS.index(view.sort) + 1) % len(TOP_SORTS)])
    if key == "r":
        return replace(view, reverse=not view.reverse)
    only = {"a": "allocated", "i": "idle", "u": "unhealthy"}.get(key)
    if only:
        return replace(view, only="all" if view.only == only else only)
    if key == "c":
        return TopView(sort=view.sort, reverse=view.reverse)
    return view


def _idle(r: dict[str, Any]) -> bool:
    return bool(r["job_id"]) and (r["util_pct"] or 0) <= USED_UTIL_PCT


def top_select(rows: Sequence[dict[str, Any]], view: TopView) -> list[dict[str, Any]]:
    keep = {"all": lambda r: True, "allocated": lambda r: bool(r["job_id"]), "idle": _idle,
            "unhealthy": lambda r: r["health"] != "healthy"}[view.only]
    needle = view.match.lower()
    out = [r for r in rows if keep(r) and (not needle or needle in " ".join(
        str(r[k] or "") for k in ("cluster", "node", "model", "health", "team", "job_id", "job_name")).lower())]
    by = {"node": lambda r: (r["cluster"], r["node"], r["index"]),
          "util": lambda r: (r["util_pct"] if r["util_pct"] is not None else -1.0),
          "mem": lambda r: (r["memory_used_mib"] if r["memory_used_mib"] is not None else -1.0),
          "temp": lambda r: (r["temperature_c"] if r["temperature_c"] is not None else -1.0),
          "power": lambda r: (r["power_w"] if r["power_w"] is not None else -1.0),
          "health": lambda r: (r["health"] != "healthy", r["health"]),
          "team": lambda r: (r["team"] or "~", r["job_name"] or "")}[view.sort]
    return sorted(out, key=lambda r: (by(r), r["cluster"], r["node"], r["index"]), reverse=view.reverse)


def top_frame(rows: Sequence[dict[str, Any]], where: str, now: datetime | None = None,
              view: TopView = TopView(), width: int = 80) -> str:
    """One frame of `gpupool top`, every line cut to `width` columns (no wrapping)."""
    now = now or datetime.now(UTC)
    alloc = sum(1 for r in rows if r["job_id"])
    used = sum(1 for r in rows if (r["util_pct"] or 0) > USED_UTIL_PCT)
    idle = sum(1 for r in rows if _idle(r))
    head = [f"gpupool top · {where} · {now.strftime('%H:%M:%S')} UTC",
            f"{len(rows)} GPUs · {alloc} allocated · {used} used (>{USED_UTIL_PCT:g}% util) · {idle} allocated-idle",
            f"sort {view.sort}{' (reversed)' if view.reverse else ''} · showing {view.only} · MEM in GiB, TEMP in C"
            + (f" matching {view.match!r}" if view.match else "")]
    shown = top_select(rows, view)
    if not shown:
        return "\n".join(line[:width] for line in head + ["", "No GPUs."])
    one_cluster = len({r["cluster"] for r in rows}) == 1

    def mem(r: dict[str, Any]) -> str:
        total = r["memory_total_mib"]
        used_gib = "-" if r["memory_used_mib"] is None else f"{r['memory_used_mib'] / 1024:.0f}"
        return f"{used_gib}/{'-' if total is None else f'{total / 1024:.0f}'}"

    def rounded(value: Any) -> Any:
        return None if value is None else round(float(value))

    def holder(r: dict[str, Any]) -> Any:
        if not r["job_id"]:
            return None
        return f"{r['job_id'][:8]} {r['team']}/{r['job_name']}" if r["job_name"] else f"{r['job_id'][:8]} {r['team']}"

    power = width >= 100  # the power column only where there is room for it
    cells = [[r["node"] if one_cluster else f"{r['cluster']}/{r['node']}", r["index"], r["model"],
              rounded(r["util_pct"]), mem(r), rounded(r["temperature_c"])]
             + ([rounded(r["power_w"])] if power else []) + [r["health"], holder(r)] for r in shown]
    headers = ["NODE", "GPU", "MODEL", "UTIL%", "MEM", "TEMP"] + (["W"] if power else []) + ["HEALTH", "JOB"]
    _fit_names(headers, cells, width)
    body = table(headers, cells)
    return "\n".join(line[:width] for line in head + [""] + body.splitlines())


def _fit_names(headers: list[str], cells: list[list[Any]], width: int) -> None:
    """Shorten the NODE (first) and JOB (last) cells, the long ones, so that a row fits `width` columns: the
    others are short by nature. The job keeps its short id; a node keeps its end (its number)."""
    fixed = sum(max(len(cell(h)), *(len(cell(r[i])) for r in cells)) for i, h in enumerate(headers)
                if 0 < i < len(headers) - 1) + 2 * (len(headers) - 1)
    room = max(width - fixed, 20)
    node_w = max(len(headers[0]), *(len(cell(r[0])) for r in cells))
    job_w = max(len(headers[-1]), *(len(cell(r[-1])) for r in cells))
    if node_w + job_w <= room:
        return
    node_w = min(node_w, max(room - job_w, 24 if room >= 40 else room // 2))
    job_w = max(room - node_w, 8)
    for r in cells:
        node, job = cell(r[0]), cell(r[-1])
        r[0] = node if len(node) <= node_w else "…" + node[-(node_w - 1):]
        r[-1] = r[-1] if len(job) <= job_w else job[:job_w - 1] + "…"


def _read_key(timeout: float) -> str | None:
    """A key pressed within `timeout` seconds (the terminal in cbreak mode), else None."""
    ready, _, _ = select.select([sys.stdin], [], [], timeout)
    return sys.stdin.read(1) if ready else None


def _top_json(args: argparse.Namespace, view: TopView, rows: list[dict[str, Any]],
              sample: Callable[[], list[dict[str, Any]]]) -> int:
    error: GpupoolError | None = None
    try:
        while True:
            print(json.dumps({"error": str(error)} if error else top_select(rows, view), default=str), flush=True)
            if args.once:
                return EXIT_OK
            time.sleep(args.interval)
            try:
                rows, error = sample(), None
            except GpupoolError as exc:
                error = exc
    except KeyboardInterrupt:
        return EXIT_OK


def cmd_top(args: argparse.Namespace, gp: GpupoolClient) -> int:
    if args.interval <= 0:
        raise UsageError("--interval must be a positive number of seconds")
    view: TopView | None = TopView(sort=args.sort, reverse=args.reverse, only=args.only, match=args.filter or "")

    def sample() -> list[dict[str, Any]]:
        return top_rows(gp.list_nodes(cluster=args.cluster), gp.list_allocations(active=True),
                        gp.list_jobs(state="running"))

    rows: list[dict[str, Any]] = sample()  # a first failure (bad token, unreachable) ends the command
    if args.output == "json":  # one JSON document per refresh (JSON lines), or one with --once
        return _top_json(args, view, rows, sample)
    if args.once:
        print(top_frame(rows, gp.base_url, view=view, width=args.width or 10_000), flush=True)
        return EXIT_OK
    keys = sys.stdin.isatty()
    saved = termios.tcgetattr(sys.stdin) if keys else None
    error: GpupoolError | None = None
    try:
        if keys:
            tty.setcbreak(sys.stdin)
        while view is not None:
            width = args.width or shutil.get_terminal_size((80, 24)).columns
            if error:  # keep watching through a restart of the gateway; say so on screen
                print(f"{CLEAR}gpupool top · {gp.base_url} · error: {error} · retrying every {args.interval:g}s",
                      flush=True)
            else:
                keys_help = "keys: s sort · r reverse · a/i/u allocated/idle/unhealthy · c clear · q quit"
                print(f"{CLEAR}{top_frame(rows, gp.base_url, view=view, width=width)}\n\n"
                      f"{(keys_help if keys else '(Ctrl-C to quit)')[:width]}", flush=True)
            key = _read_key(args.interval) if keys else (time.sleep(args.interval) or None)
            if key is not None:
                view = top_key(view, key)
                continue  # redraw at once with the same sample
            try:
                rows, error = sample(), None
            except GpupoolError as exc:
                error = exc
    except KeyboardInterrupt:  # the way out of the live view
        pass
    finally:
        if saved is not None:
            termios.tcsetattr(sys.stdin, termios.TCSADRAIN, saved)
    return EXIT_OK


def register(sub: argparse._SubParsersAction, add: Adder) -> None:
    """gpupool nodes | pool | top."""
    p = add("nodes", cmd_nodes, "nodes with GPU counts, health and last telemetry")
    p.add_argument("--cluster")

    p = add("pool", cmd_pool, "GPUs per cluster and model: allocated, used, allocated-but-idle, unhealthy, free")
    p.add_argument("--cluster")
    p.add_argument("--fragmentation", action="store_true",
                   help="free GPUs that no recently asked-for job shape could use (FGD's measure)")

    p = add("top", cmd_top, "live per-GPU view: utilization, memory, temperature, power, health, holder; keys "
                            "s r a i u c q sort and filter it")
    p.add_argument("--interval", type=float, default=2.0, help="seconds between refreshes (default 2)")
    p.add_argument("--once", action="store_true", help="print one frame and exit")
    p.add_argument("--cluster")
    p.add_argument("--sort", choices=TOP_SORTS, default="node", help="first sort (key s cycles; default node)")
    p.add_argument("--reverse", action="store_true", help="highest first (key r)")
    p.add_argument("--only", choices=TOP_FILTERS, default="all",
                   help="only allocated, allocated-idle or unhealthy GPUs (keys a, i, u)")
    p.add_argument("--filter", metavar="TEXT", help="only GPUs whose node, model, health, team or job contains TEXT")
    p.add_argument("--width", type=int, help="cut lines at this many columns (default: the terminal's; --once: none)")


# --- nodes: cordon, drain, sharing, GPU health, orphans (operators) ---------------------------------------------------
SHARING_MODES = ("exclusive", "fractional", "mig")


def node_text(n: Node) -> str:
    cordon = "no"
    if n.cordoned:
        info = n.cordon or {}
        cordon = ("drained" if n.drained else "cordoned") + (f" by {info['by']}" if info.get("by") else "") + \
            (f": {info['reason']}" if info.get("reason") else "")
    net, st = n.network, n.storage
    throughput = None if net.rx_mbps is None and net.tx_mbps is None else \
        "rx {} / tx {} Mbit/s".format(*("-" if v is None else f"{v:.0f}" for v in (net.rx_mbps, net.tx_mbps)))
    volumes = ", ".join(f"{v.mount} {fmt_tib(v.total_gib)} TiB" + (f" {v.filesystem}" if v.filesystem else "")
                        for v in st.volumes)
    head = key_values([("node", f"{n.cluster}/{n.node}"), ("state", n.state), ("cordoned", cordon),
                       ("cpus", n.cpu_count), ("cpu use %", n.cpu_util_pct),
                       ("memory GiB", f"{fmt_gib(n.memory_used_mib)}/{fmt_gib(n.memory_mib)} used"
                        if n.memory_used_mib is not None else fmt_gib(n.memory_mib)),
                       ("network", f"{fmt_network(net)} ({num(net.link_gbps)} Gbit/s)" if net.interfaces else None),
                       ("throughput", throughput),
                       ("storage", f"{fmt_storage(st)} used" if st.volumes else None),
                       ("volumes", volumes or None),
                       ("last seen", fmt_age(n.last_seen_at) + " ago" if n.last_seen_at else None)])
    rows = [[g.index, g.model, g.state, g.state_reason or None, fmt_age(g.state_since) if g.state_since else None,
             g.sharing, num(g.telemetry.utilization_gpu_pct) if g.telemetry else None,
             g.telemetry.process_count if g.telemetry else None, g.allocation_id] for g in n.gpus]
    return head + "\n\n" + table(["GPU", "MODEL", "STATE", "WHY", "FOR", "SHARING", "UTIL %", "PROCS", "ALLOCATION"],
                                  rows)


def cmd_node(args: argparse.Namespace, gp: GpupoolClient) -> int:
    n = gp.get_node(args.node, cluster=args.cluster)
    emit(args, n.raw, lambda: node_text(n))
    return EXIT_OK


def cmd_cordon(args: argparse.Namespace, gp: GpupoolClient) -> int:
    """cordon / uncordon / drain share one function: the subcommand's name is the action."""
    action = args.node_action
    if action == "uncordon":
        n = gp.uncordon(args.node, cluster=args.cluster)
    else:
        n = getattr(gp, action)(args.node, reason=args.reason or "", cluster=args.cluster)
    state = "drained" if n.drained else "cordoned" if n.cordoned else "schedulable"
    emit(args, n.raw, lambda: f"node {n.cluster}/{n.node} is {state}")
    return EXIT_OK


def cmd_sharing(args: argparse.Namespace, gp: GpupoolClient) -> int:
    out = gp.set_gpu_sharing(args.node, args.gpu, args.mode, cluster=args.cluster)
    emit(args, out.raw, lambda: f"GPU {out.index} on {out.cluster}/{out.node}: {out.mode}"
                                + (f", draining to {out.draining_to} (no new work; switches once its work is "
                                   "released)" if out.draining_to else "" if out.changed else " (unchanged)"))
    return EXIT_OK


def cmd_gpu_health(args: argparse.Namespace, gp: GpupoolClient) -> int:
    out = gp.set_gpu_health(args.node, args.gpu, args.action, reason=args.reason or "", cluster=args.cluster)
    emit(args, out.raw, lambda: f"GPU {out.index} on {out.cluster}/{out.node}: {out.before} -> {out.state}"
                                + ("" if out.changed else " (unchanged)"))
    return EXIT_OK


def cmd_orphans(args: argparse.Namespace, gp: GpupoolClient) -> int:
    items = gp.list_orphans(cluster=args.cluster, open_only=not args.all, limit=args.limit)
    emit(args, raws(items), lambda: table(
        ["KIND", "NODE", "GPU", "ALLOCATION", "JOB", "TEAM", "SINCE", "RESOLVED"],
        [[o.kind, f"{o.cluster}/{o.node}", o.gpu_uuid, o.allocation_id, o.job_id, o.team, o.since, o.resolved_at]
         for o in items]) if items else "No orphans.")
    return EXIT_OK


def register_node_commands(sub: argparse._SubParsersAction, add: Adder) -> None:
    """gpupool node | cordon | uncordon | drain | sharing | gpu-health | orphans."""
    def node_args(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
        p.add_argument("node", metavar="NODE")
        p.add_argument("--cluster", help="needed only when the node name exists in several clusters")
        return p

    node_args(add("node", cmd_node, "one node: its GPUs' health state, sharing mode, holder and telemetry"))
    for action, text in (("cordon", "cordon a node: no new work is placed on it (running work stays)"),
                         ("drain", "drain a node: cordon it and take its allocations back (jobs are requeued)"),
                         ("uncordon", "uncordon a node: it takes new work again")):
        p = node_args(add(action, cmd_cordon, text + " (operators, admins)"))
        p.set_defaults(node_action=action)
        if action != "uncordon":
            p.add_argument("--reason", help="why (recorded with the node and in the audit log)")
    p = node_args(add("sharing", cmd_sharing, "set how one GPU is shared: exclusive, fractional or mig (operators, "
                                              "admins)"))
    p.add_argument("gpu", metavar="GPU", type=int, help="the GPU's index on the node")
    p.add_argument("mode", metavar="MODE", choices=SHARING_MODES)
    p = node_args(add("gpu-health", cmd_gpu_health, "clear a GPU's quarantine (it enters probation) or quarantine it "
                                                    "now (operators, admins)"))
    p.add_argument("gpu", metavar="GPU", type=int, help="the GPU's index on the node")
    p.add_argument("action", metavar="ACTION", choices=("clear", "quarantine"))
    p.add_argument("--reason", help="why (recorded with the GPU and in the audit log)")
    p = add("orphans", cmd_orphans, "processes on GPUs no allocation holds; allocations whose GPUs run no process")
    p.add_argument("--cluster")
    p.add_argument("--all", action="store_true", help="also those that have since resolved")
    p.add_argument("--limit", type=int, help="show at most this many")

