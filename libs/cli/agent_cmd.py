"""`gpupool agent`: run the edge agent in the foreground — on a GPU node with the real NVML backend, or a simulated
fleet of N nodes (`--simulate N`) for development and load (the inventory benchmark runs several of these).

The agent is a service (services/agent); this command only builds its settings (GPUPOOL_AGENT_*) from flags and
replaces itself with `python -m services.agent.main`, so signals and exit codes are the agent's own.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path


def agent_env(args: argparse.Namespace, base: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ if base is None else base)
    settings = {"CLUSTER": args.cluster, "INTERVAL_S": str(args.interval), "LOG_LEVEL": args.log_level,
                "HTTP_PORT": str(args.http_port)}
    if args.nats_url:
        settings["NATS_URL"] = args.nats_url
    if getattr(args, "heartbeat", None) is not None:
        settings["HEARTBEAT_S"] = str(args.heartbeat)
    if getattr(args, "background", ""):
        settings["SIM_BACKGROUND"] = args.background
    if args.simulate:
        settings.update(BACKEND="sim", SIM_FLEET=";".join([f"{args.model}*{args.gpus_per_node}"] * args.simulate),
                        SIM_NODE_PREFIX=args.prefix, SEED=str(args.seed))
    else:
        settings["BACKEND"] = "real"
        if args.node:
            settings["NODE"] = args.node
    env.update({f"GPUPOOL_AGENT_{k}": v for k, v in settings.items()})
    return env


def default_nats_url() -> str | None:
    """GPUPOOL_NATS_URL, else the NATS URL of a local `gpupool up` (its run.json)."""
    if os.environ.get("GPUPOOL_NATS_URL"):
        return os.environ["GPUPOOL_NATS_URL"]
    run = Path(os.environ.get("GPUPOOL_DATA_DIR", ".gpupool")) / "run.json"
    try:
        return json.loads(run.read_text())["nats_url"]
    except (OSError, ValueError, KeyError):
        return None


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="gpupool agent", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--simulate", type=int, default=0, metavar="N",
                   help="run N simulated nodes in this process (0, the default: this node, real NVML)")
    p.add_argument("--gpus-per-node", type=int, default=8, metavar="G", help="simulated GPUs per node (default 8)")
    p.add_argument("--model", default="H100-80GB", help="simulated GPU model (default H100-80GB)")
    p.add_argument("--prefix", default="sim-node", help="simulated node names: PREFIX-0, PREFIX-1, ...")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--node", help="this node's name (real backend; default the hostname)")
    p.add_argument("--cluster", default="local")
    p.add_argument("--interval", type=float, default=1.0, help="seconds between samples (default 1)")
    p.add_argument("--nats-url", default=default_nats_url(),
                   help="NATS server (default $GPUPOOL_NATS_URL, else the running `gpupool up`)")
    p.add_argument("--heartbeat", type=float, default=None, metavar="S",
                   help="sampling by change: send a node's sample when a GPU moved beyond the deadband or S seconds "
                        "after the last one sent (default the agent's HEARTBEAT_S, 5); 0: send every sample")
    p.add_argument("--background", default="", metavar="KIND=SHARE,...",
                   help="simulated load on unallocated GPUs, e.g. training=0.4,inference=0.3,dev=0.2 (the rest free)")
    p.add_argument("--http-port", type=int, default=0, help="/metrics port (0: a free one)")
    p.add_argument("--log-level", default="WARNING")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.simulate < 0 or args.gpus_per_node < 1 or args.interval <= 0:
        print("gpupool agent: --simulate ≥ 0, --gpus-per-node ≥ 1 and --interval > 0", file=sys.stderr)
        return 2
    os.execve(sys.executable, [sys.executable, "-m", "services.agent.main"], agent_env(args))
    return 0  # pragma: no cover - execve does not return


if __name__ == "__main__":
    sys.exit(main())
