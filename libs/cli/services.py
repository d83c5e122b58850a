"""`gpupool endpoints`, `gpupool load`, `gpupool update`: a service's replicas, its load, its new work.

  gpupool endpoints JOB_ID                        where each live replica serves, and which are ready
  gpupool load JOB_ID VALUE [--reporter NAME]     report the service's load to its autoscaler
  gpupool update [--env NAME=VALUE ...] JOB_ID [-- CMD ARGS...]   roll out a new command and/or env

A service is a job with `replicas` whose work names `ports` (and a `health` check): submit it from a YAML file with
`gpupool submit -f service.yaml` (keys as in the HTTP body: ports, health, min_replicas, max_replicas, autoscale).
`update` replaces the whole environment with the --env given (none: the env is kept) and rolls the change out
replica by replica, never below the replicas ready; its flags go before JOB_ID, the new command after `--`.
"""

from __future__ import annotations

import argparse
import shlex
from collections.abc import Callable

from libs.cli.common import EXIT_OK, UsageError
from libs.cli.render import emit, table
from libs.cli.work import parse_env
from libs.client import GpupoolClient


def cmd_endpoints(args: argparse.Namespace, gp: GpupoolClient) -> int:
    items = gp.list_endpoints(args.job_id)

    def render() -> str:
        if not items:
            return f"job {args.job_id} has no live replica"
        ready = sum(1 for i in items if i["ready"])
        rows = [[i["replica"], i["node"], i["url"] or "-", "yes" if i["ready"] else "no",
                 i.get("reason") or "", i.get("since") or ""] for i in items]
        return f"{ready} of {len(items)} replica(s) ready\n" + table(
            ["REPLICA", "NODE", "URL", "READY", "REASON", "SINCE"], rows)

    emit(args, {"job_id": args.job_id, "items": items}, render)
    return EXIT_OK


def cmd_load(args: argparse.Namespace, gp: GpupoolClient) -> int:
    if args.value < 0:
        raise UsageError("the load cannot be negative")
    done = gp.report_load(args.job_id, args.value, args.reporter or "")
    who = f" from {done['reporter']}" if done.get("reporter") else ""
    emit(args, done, lambda: f"job {args.job_id}: load {done['value']:g}{who} reported at {done['at']}")
    return EXIT_OK


def cmd_update(args: argparse.Namespace, gp: GpupoolClient) -> int:
    command = args.command or None
    env = parse_env(args.env) if args.env is not None else None
    if command is None and env is None:
        raise UsageError("give the new command after --, or --env NAME=VALUE (or both)")
    job = gp.update_work(args.job_id, command=command, env=env)
    work = job.raw.get("work") or {}

    def render() -> str:
        lines = [f"job {job.job_id}: rolling out its new work, replica by replica (state {job.state})"]
        if work.get("command"):
            lines.append(f"  runs: {shlex.join(work['command'])}")
        if work.get("env") is not None:
            lines.append("  env: " + (" ".join(f"{k}={v}" for k, v in sorted(work["env"].items())) or "(empty)"))
        lines.append(f"  follow it: gpupool endpoints {job.job_id}")
        return "\n".join(lines)

    emit(args, job.raw, render)
    return EXIT_OK


def register(sub: argparse._SubParsersAction, add: Callable[..., argparse.ArgumentParser]) -> None:
    p = add("endpoints", cmd_endpoints, "where a service's live replicas serve, and which are ready")
    p.add_argument("job_id", metavar="JOB_ID")
    p = add("load", cmd_load, "report a service's load (requests in flight, queue length) to its autoscaler")
    p.add_argument("job_id", metavar="JOB_ID")
    p.add_argument("value", type=float, metavar="VALUE")
    p.add_argument("--reporter", metavar="NAME", help="who reports (each reporter's latest value counts; "
                                                      "default: the service as a whole)")
    p = add("update", cmd_update, "roll a service's new command and/or env out, replica by replica (flags before "
                                  "JOB_ID, the new command after --)")
    p.add_argument("job_id", metavar="JOB_ID")
    p.add_argument("--env", action="append", metavar="NAME=VALUE",
                   help="the new environment (repeatable; replaces the whole env)")
    p.add_argument("command", nargs="*", metavar="-- CMD ARGS", help="the new command (argv)")
