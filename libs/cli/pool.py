"""The pool and its nodes: `gpupool nodes | pool | top` for everyone, and the operators' `gpupool node | cordon |
uncordon | drain | sharing | gpu-health | orphans`."""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from libs.cli.common import EXIT_OK, Adder, UsageError
from libs.cli.render import emit, fmt_age, fmt_gib, key_values, num, raws, table
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
                "health": g.health, "job_id": a.job_id if a else None, "team": a.team if a else None,
                "job_name": job.name if job else None,
            })
    return rows


def top_frame(rows: Sequence[dict[str, Any]], where: str, now: datetime | None = None) -> str:
    now = now or datetime.now(UTC)
    alloc = sum(1 for r in rows if r["job_id"])
    used = sum(1 for r in rows if (r["util_pct"] or 0) > USED_UTIL_PCT)
    idle = sum(1 for r in rows if r["job_id"] and (r["util_pct"] or 0) <= USED_UTIL_PCT)
    head = (f"gpupool top · {where} · {now.strftime('%H:%M:%S')} UTC · {len(rows)} GPUs · {alloc} allocated · "
            f"{used} used (>{USED_UTIL_PCT:g}% util) · {idle} allocated-idle")
    if not rows:
        return head + "\n\nNo GPUs."

    def mem(r: dict[str, Any]) -> str:
        return f"{fmt_gib(r['memory_used_mib'])}/{fmt_gib(r['memory_total_mib'])}"

    def util(r: dict[str, Any]) -> Any:
        return None if r["util_pct"] is None else round(float(r["util_pct"]))

    def holder(r: dict[str, Any]) -> Any:
        if not r["job_id"]:
            return None
        return f"{r['job_id']} ({r['team']}/{r['job_name']})" if r["job_name"] else f"{r['job_id']} ({r['team']})"

    body = table(["NODE", "GPU", "MODEL", "UTIL %", "MEM GiB", "TEMP C", "POWER W", "HEALTH", "ALLOCATED TO"],
                 [[f"{r['cluster']}/{r['node']}", r["index"], r["model"], util(r), mem(r),
                   None if r["temperature_c"] is None else round(float(r["temperature_c"])),
                   None if r["power_w"] is None else round(float(r["power_w"])), r["health"], holder(r)]
                  for r in rows])
    return f"{head}\n\n{body}"


def cmd_top(args: argparse.Namespace, gp: GpupoolClient) -> int:
    if args.interval <= 0:
        raise UsageError("--interval must be a positive number of seconds")

    def sample() -> list[dict[str, Any]]:
        return top_rows(gp.list_nodes(cluster=args.cluster), gp.list_allocations(active=True),
                        gp.list_jobs(state="running"))

    rows: list[dict[str, Any]] = sample()  # a first failure (bad token, unreachable) ends the command
    error: GpupoolError | None = None
    try:
        while True:
            if args.output == "json":
                print(json.dumps({"error": str(error)} if error else rows, default=str), flush=True)
            elif error:  # keep watching through a restart of the gateway; say so on screen
                print(f"{CLEAR}gpupool top · {gp.base_url} · error: {error} · retrying every {args.interval:g}s",
                      flush=True)
            else:
                frame = top_frame(rows, gp.base_url)
                print(frame if args.once else f"{CLEAR}{frame}\n\n(Ctrl-C to quit)", flush=True)
            if args.once:
                return EXIT_OK
            time.sleep(args.interval)
            try:
                rows, error = sample(), None
            except GpupoolError as exc:
                error = exc
    except KeyboardInterrupt:  # the way out of the live view
        return EXIT_OK


def register(sub: argparse._SubParsersAction, add: Adder) -> None:
    """gpupool nodes | pool | top."""
    p = add("nodes", cmd_nodes, "nodes with GPU counts, health and last telemetry")
    p.add_argument("--cluster")

    p = add("pool", cmd_pool, "GPUs per cluster and model: allocated, used, allocated-but-idle, unhealthy, free")
    p.add_argument("--cluster")
    p.add_argument("--fragmentation", action="store_true",
                   help="free GPUs that no recently asked-for job shape could use (FGD's measure)")

    p = add("top", cmd_top, "live per-GPU view: utilization, memory, temperature, power, health, holder")
    p.add_argument("--interval", type=float, default=2.0, help="seconds between refreshes (default 2)")
    p.add_argument("--once", action="store_true", help="print one frame and exit")
    p.add_argument("--cluster")


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

