"""The `gpupool` command.

  gpupool up       run the whole platform locally (embedded NATS + PostgreSQL, every service a process)
  gpupool down     stop a platform started by `gpupool up`
  gpupool status   where the running platform is and whether every service is ready
  gpupool sim      trace-replay simulator on the scheduling core (`gpupool sim --help`)
  gpupool bench    benchmarks; writes docs/benchmarks.md (`bench platform`, `bench counts`, `bench run`, `bench inventory`, `bench reclaim`, `bench replay`, core/simulator)
  gpupool agent    the node agent: real NVML, or `--simulate N` nodes for development and load
  gpupool schemas  write the JSON Schema of every event type to a folder
  gpupool check    verify the platform's invariants from its stores and streams, read-only (`gpupool check --help`)
  gpupool chaos    fault-injection rounds under load against its own `gpupool up` (`gpupool chaos --help`)

People-facing commands on the gateway's API (libs/cli/, one module per group): submit, run, logs, jobs, describe,
explain, scale, cancel, complete, nodes, pool, top, teams, quota, priority-classes, approvals, reclaim-policies, usage,
token, audit, whoami, decisions, completion. `gpupool <command> --help` for each.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import urllib.request
from pathlib import Path

DEFAULT_DATA_DIR = Path(os.environ.get("GPUPOOL_DATA_DIR", ".gpupool"))


def fleet_spec(value: str) -> str:
    """`--fleet`, checked before anything starts (a bad option is a usage error, not a traceback mid-start)."""
    from libs.contracts.fleet import parse_fleet_nodes

    try:
        if not parse_fleet_nodes(value):
            raise ValueError("no node in it")
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"bad fleet {value!r}: {exc}") from None
    return value


def cmd_up(args: argparse.Namespace) -> int:
    from libs.devstack.stack import Stack, StackOptions

    opts = StackOptions(
        data_dir=args.data_dir.resolve(),
        nats_url=os.environ.get("GPUPOOL_NATS_URL") or None,
        database_url=os.environ.get("GPUPOOL_DATABASE_URL") or None,
        gateway_port=args.port,
        sim_fleet=args.fleet,
        agent_interval_s=args.telemetry_interval,
        with_agent=not args.no_agent,
        log_level=args.log_level,
        database_prefix=os.environ.get("GPUPOOL_DATABASE_PREFIX", "gpupool"),
        placement_replicas=max(args.placement_replicas, args.replicas),
        replicas=args.replicas,
        nats_cluster=args.nats_cluster,
        service_env=parse_service_env(args.env),
        pg_settings=parse_pg_settings(args.pg_setting),
        unsafe_fast=args.unsafe_fast,
        otlp_endpoint=args.otlp_endpoint,
    )
    stack = Stack(opts)
    print("starting gpupool …", flush=True)
    try:
        stack.start(say=lambda line: print("  " + line, flush=True))
    except Exception as exc:
        print(f"gpupool up failed: {exc}", file=sys.stderr)
        return 1
    # The token goes to the terminal of whoever started the platform, never into a log that output is sent to.
    token_file = stack.options.data_dir / "admin-token"
    shown = stack.admin_token if sys.stdout.isatty() else f"in {token_file} (not printed: output is not a terminal)"
    bearer = stack.admin_token if sys.stdout.isatty() else f"$(cat {token_file})"
    print(f"""
gpupool is up.
  gateway      {stack.gateway_url}   (OpenAPI: {stack.gateway_url}/docs)
  admin token  {shown}
  run file     {stack.run_file}

Try:
  curl -s -X POST {stack.gateway_url}/v1/jobs -H "Authorization: Bearer {bearer}" \\
       -H 'Content-Type: application/json' -d '{{"name":"demo","team":"research","gpus":2}}'
  curl -s {stack.gateway_url}/v1/allocations -H "Authorization: Bearer {bearer}"

Ctrl-C (or `gpupool down`) stops everything.""", flush=True)
    try:
        stack.supervise(say=lambda line: print(line, flush=True))
    finally:
        print("stopping …", flush=True)
        stack.stop(say=lambda line: print(line, flush=True))
    return 0


def parse_service_env(items: list[str]) -> dict[str, dict[str, str]]:
    out: dict[str, dict[str, str]] = {}
    for item in items:
        service, sep, assignment = item.partition(":")
        key, eq, value = assignment.partition("=")
        if not sep or not eq or not service or not key:
            raise SystemExit(f"gpupool up: --env expects SERVICE:SETTING=VALUE, got {item!r}")
        out.setdefault(service, {})[key.upper()] = value
    return out


def parse_pg_settings(items: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items:
        key, eq, value = item.partition("=")
        if not eq or not key.strip() or not key.replace("_", "").replace(".", "").isalnum():
            raise SystemExit(f"gpupool up: --pg-setting expects NAME=VALUE, got {item!r}")
        out[key.strip()] = value
    return out


def cmd_down(args: argparse.Namespace) -> int:
    from libs.devstack.stack import stop_running

    if stop_running(args.data_dir.resolve()):
        print("gpupool stopped")
        return 0
    print(f"no running gpupool found in {args.data_dir}", file=sys.stderr)
    return 1


def cmd_status(args: argparse.Namespace) -> int:
    from libs.devstack.stack import read_run_file

    doc = read_run_file(args.data_dir.resolve())
    if not doc:
        print(f"no running gpupool found in {args.data_dir}", file=sys.stderr)
        return 1
    try:
        with urllib.request.urlopen(doc["gateway_url"] + "/readyz", timeout=3) as resp:
            ready = json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        ready = json.loads(exc.read() or b"{}")
    except Exception as exc:
        ready = {"status": f"gateway unreachable: {exc}"}
    from libs.devstack.stack import redact

    print(redact(json.dumps({"gateway_url": doc["gateway_url"], "nats_url": doc["nats_url"],
                             "postgres_durable": doc.get("postgres_durable"), "ready": ready,
                             "services": doc["services"]}, indent=2)))
    return 0 if ready.get("status") == "ready" else 1


def cmd_sim(argv: list[str]) -> int:
    from libs.sim.cli import main as sim_main

    return sim_main(argv)


def cmd_bench(argv: list[str]) -> int:
    """`gpupool bench platform ...`: the end-to-end platform benchmark; anything else: the core/simulator ones."""
    if argv and argv[0] == "platform":
        from libs.bench.e2e import main as platform_main

        return platform_main(argv[1:])
    if argv and argv[0] == "counts":
        from libs.bench.counts import main as counts_main

        return counts_main(argv[1:])
    if argv and argv[0] == "reclaim":
        from libs.bench.reclaim import main as reclaim_main

        return reclaim_main(argv[1:])
    if argv and argv[0] == "backlog":
        from libs.bench.backlog import main as backlog_main

        return backlog_main(argv[1:])
    if argv and argv[0] == "placement-cycle":
        from libs.bench.placement_cycle import main as placement_cycle_main

        return placement_cycle_main(argv[1:])
    if argv and argv[0] == "run":
        from libs.bench.run import main as run_main

        return run_main(argv[1:])
    if argv and argv[0] == "replay":
        from libs.bench.replay import main as replay_main

        return replay_main(argv[1:])
    if argv and argv[0] == "inventory":
        from libs.bench.inventory import main as inventory_main

        return inventory_main(argv[1:])
    from libs.bench.core import main as bench_main

    return bench_main(argv)


def cmd_schemas(args: argparse.Namespace) -> int:
    from libs.contracts.events import event_json_schemas

    args.out.mkdir(parents=True, exist_ok=True)
    for event_type, schema in event_json_schemas().items():
        (args.out / f"{event_type}.json").write_text(json.dumps(schema, indent=2, sort_keys=True) + "\n")
    print(f"wrote {len(event_json_schemas())} schemas to {args.out}")
    return 0


def cmd_asyncapi(args: argparse.Namespace) -> int:
    from libs.contracts.asyncapi import main as asyncapi_main

    return asyncapi_main(["--out", str(args.out)])


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gpupool", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)

    up = sub.add_parser("up", help="run the whole platform locally")
    up.add_argument("--data-dir", type=Path, default=DEFAULT_DATA_DIR,
                    help="where NATS/PostgreSQL data, logs, run.json and the admin token live (default .gpupool)")
    up.add_argument("--port", type=int, default=int(os.environ.get("GPUPOOL_GATEWAY_PORT", "8080")),
                    help="gateway port (default 8080; 0 picks a free one)")
    up.add_argument("--fleet", default=None, type=fleet_spec,
                    help="simulated nodes, ';'-separated, each MODEL*COUNT[,MODEL*COUNT][@OPTION,...]; options "
                         "rack=R, block=B, numa=N, nvlink=all|pairs|none "
                         "(default: H100-80GB*8;A100-80GB*8;H200-141GB*8;L40S*8)")
    up.add_argument("--telemetry-interval", type=float, default=1.0, help="seconds between agent samples")
    up.add_argument("--no-agent", action="store_true", help="start no simulated agent fleet")
    up.add_argument("--env", action="append", default=[], metavar="SERVICE:SETTING=VALUE",
                    help="override one service setting, e.g. placement:PREEMPTION_GRACE_S=5 (repeatable)")
    up.add_argument("--placement-replicas", type=int, default=1, choices=range(1, 4), metavar="N",
                    help="placement replicas (1-3); one leads through a NATS KV lease, the others stand by")
    up.add_argument("--replicas", type=int, default=1, choices=range(1, 4), metavar="N",
                    help="replicas of every backend service (1-3): they share durable consumers and request queue "
                         "groups; placement's extra replicas stand by on the lease")
    up.add_argument("--nats-cluster", type=int, default=0, choices=(0, 3, 5), metavar="N",
                    help="embedded NATS as a JetStream cluster of N (3 or 5) servers with streams replicated "
                         "three ways (default: one server)")
    up.add_argument("--pg-setting", action="append", default=[], metavar="NAME=VALUE",
                    help="extra setting of the embedded PostgreSQL, e.g. shared_preload_libraries=pg_stat_statements "
                         "(repeatable; ignored with GPUPOOL_DATABASE_URL)")
    up.add_argument("--unsafe-fast", action="store_true",
                    help="run the embedded PostgreSQL without fsync: faster commits, but a machine crash or power "
                         "cut can lose committed jobs (tests and benchmarks that say so; default: durable)")
    up.add_argument("--otlp-endpoint", metavar="URL", default=os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or None,
                    help="export every process's traces over OTLP/HTTP to this collector, e.g. "
                         "http://127.0.0.1:4318 (sets OTEL_EXPORTER_OTLP_ENDPOINT for each; default: that variable "
                         "if set, else no export)")
    up.add_argument("--log-level", default="INFO")
    up.set_defaults(func=cmd_up)

    for name, func, text in (("down", cmd_down, "stop the platform started by `gpupool up`"),
                             ("status", cmd_status, "show where the platform runs and whether it is ready")):
        p = sub.add_parser(name, help=text)
        p.add_argument("--data-dir", type=Path, default=DEFAULT_DATA_DIR)
        p.set_defaults(func=func)

    sub.add_parser("sim", help="trace-replay simulator (see `gpupool sim --help`)", add_help=False)
    sub.add_parser("bench", help="run benchmarks and write docs/benchmarks.md", add_help=False)
    sub.add_parser("agent", help="run the node agent (real NVML, or --simulate N nodes)", add_help=False)
    sub.add_parser("check", help="verify the platform's invariants (see `gpupool check --help`)", add_help=False)
    sub.add_parser("chaos", help="fault-injection rounds under load (see `gpupool chaos --help`)", add_help=False)

    from libs.cli import creds_cmd, nats_cmd

    creds_cmd.register(sub)
    nats_cmd.register(sub)

    schemas = sub.add_parser("schemas", help="export the JSON Schema of every event type")
    schemas.add_argument("--out", type=Path, default=Path("docs/schemas"))
    schemas.set_defaults(func=cmd_schemas)

    asyncapi = sub.add_parser("asyncapi", help="write the bus's AsyncAPI 3.0 document (docs/asyncapi.yaml)")
    asyncapi.add_argument("--out", type=Path, default=Path("docs/asyncapi.yaml"))
    asyncapi.set_defaults(func=cmd_asyncapi)

    register_people_commands(sub, parser)
    return parser


def register_people_commands(sub: argparse._SubParsersAction, parser: argparse.ArgumentParser) -> None:
    """The people-facing commands on the gateway's API, group by group, in the order `--help` lists them."""
    from libs.cli import completion, decisions, jobs, pool, quota, reports, services, tokens, work
    from libs.cli.common import Adder, common_parser

    add = Adder(sub, common_parser())
    for register in (work.register,  # submit, run, logs
                     services.register,  # endpoints, load, update
                     jobs.register,  # jobs, describe, explain, scale, cancel, complete
                     pool.register,  # nodes, pool, top
                     quota.register,  # teams, quota, priority-classes, approvals, reclaim-policies
                     reports.register,  # usage, report (and history), cost-rates
                     tokens.register,  # token, audit, whoami
                     pool.register_node_commands,  # node, cordon, drain, uncordon, sharing, gpu-health, orphans
                     decisions.register):  # decisions list|show|replay
        register(sub, add)
    completion.register(sub, parser)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "sim":
        return cmd_sim(argv[1:])
    if argv and argv[0] == "bench":
        return cmd_bench(argv[1:])
    if argv and argv[0] == "check":
        from libs.check.cli import main as check_main

        return check_main(argv[1:])
    if argv and argv[0] == "chaos":
        from libs.chaos.suite import main as chaos_main

        return chaos_main(argv[1:])
    if argv and argv[0] == "agent":
        from libs.cli.agent_cmd import main as agent_main

        return agent_main(argv[1:])
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
