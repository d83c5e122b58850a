"""`gpupool nats`: the bus's identities for a deployment that `gpupool up` does not run (Kubernetes, compose).

  gpupool nats export --target kubernetes --out DIR --node CLUSTER/NODE ...
      DIR/nats-secrets.yaml: the Secret `nats-auth` (the server's authorization block) and a Secret
      `nats-identity-<name>` per service, the supervisor and the observer (kubectl apply -f it);
      DIR/nodes/agent-<cluster>-<node>.nk: each node's seed, to copy to that node only as
      /etc/gpupool/nats/agent.nk (mode 0600), where deploy/kubernetes/agent.yaml mounts it from.
  gpupool nats export --target compose --out DIR
      what docker-compose.yml mounts (GPUPOOL_SECRETS_DIR, default ./.gpupool-compose): nats/auth.conf, a seed per
      workload, agent/ with the simulated fleet's node seeds.
  gpupool nats provision --url URL --nkey-file SEED [--replicas N]
      as the supervisor (the only identity that may): declare gpupool's streams and the leases bucket; the
      Kubernetes Job `nats-provision` and compose's `nats-provision` run it before the services start.

The seeds are made once in the store (`--store`, default <data-dir>/secrets/nats, mode 0700) and reused: export
again after adding a node, apply the new Secret, reload the NATS servers, and every other credential still holds.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from libs.contracts.fleet import DEFAULT_SIM_FLEET, sim_node_names
from libs.devstack.nats_auth import IdentityStore
from libs.devstack.nats_export import NODE_SEED_PATH, add_nodes, export_compose, export_kubernetes

IMAGE_USER = (10001, 10001)  # the Dockerfile's `gpupool` user: compose's containers read their seeds as it


def parse_node(text: str) -> tuple[str, str]:
    cluster, sep, node = text.partition("/")
    if not sep or not cluster or not node or "/" in node:
        raise argparse.ArgumentTypeError(f"{text!r}: expected CLUSTER/NODE")
    return cluster, node


def cmd_export(args: argparse.Namespace) -> int:
    store = IdentityStore((args.store or args.data_dir / "secrets" / "nats").resolve())
    nodes = list(args.node)
    if args.target == "compose" and not nodes:  # compose's agent simulates a fleet: one identity per node
        nodes = [(args.cluster, name) for name in sim_node_names("sim-node", args.sim_fleet)]
    try:
        add_nodes(store, nodes)
    except ValueError as exc:
        print(f"gpupool nats export: {exc}", file=sys.stderr)
        return 1
    out = args.out.resolve()
    if args.target == "kubernetes":
        result = export_kubernetes(store, out, args.namespace)
        print(f"""# kubectl apply -f {result.files[0]}   (then deploy/kubernetes; re-export and apply after adding nodes,
# then reload each NATS pod: kubectl -n {args.namespace} exec nats-0 -- nats-server --signal reload=/var/run/nats/nats.pid)
# Copy each node's seed to that node only, as {NODE_SEED_PATH} (mode 0600, owner root):""")
        for identity, seed in result.node_seeds.items():
            print(f"{identity}\t{seed}")
        return 0
    owner = IMAGE_USER if os.geteuid() == 0 else None
    result = export_compose(store, out, owner)
    print(f"# GPUPOOL_SECRETS_DIR={out} docker compose up -d   ({len(result.files)} workload files, "
          f"{len(result.node_seeds)} node seeds)")
    if owner is None:
        print(f"# not root: the containers run as uid {IMAGE_USER[0]}; give them the seeds with "
              f"`sudo chown -R {IMAGE_USER[0]}:{IMAGE_USER[1]} {out}` (nats/ may stay yours)", file=sys.stderr)
    return 0


def cmd_provision(args: argparse.Namespace) -> int:
    from libs.devstack.nats_auth import Identity
    from libs.devstack.stack import provision

    seed = Path(args.nkey_file)
    if not seed.is_file():
        print(f"gpupool nats provision: no seed file {seed}", file=sys.stderr)
        return 1
    supervisor = Identity("supervisor", "", seed, (), ())
    deadline = time.monotonic() + args.timeout
    while True:  # the servers may still be starting (a Job starts with them): keep trying until the deadline
        try:
            provision(args.url, supervisor, replicas=args.replicas)
            print(f"gpupool nats provision: streams and the leases bucket declared ({args.replicas} replicas)")
            return 0
        except Exception as exc:  # noqa: BLE001 - reported, retried, then the exit code says it failed
            if time.monotonic() > deadline:
                print(f"gpupool nats provision: {type(exc).__name__}: {exc}", file=sys.stderr)
                return 1
            print(f"gpupool nats provision: not yet ({type(exc).__name__}: {exc}); retrying", file=sys.stderr)
            time.sleep(2)


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("nats", help="export the bus's identities for Kubernetes or compose; provision streams",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    verbs = p.add_subparsers(dest="verb", required=True)
    export = verbs.add_parser("export", help="write the NATS authorization and every identity's seed")
    export.add_argument("--target", choices=("kubernetes", "compose"), required=True)
    export.add_argument("--out", type=Path, required=True, help="directory to write into (mode 0700)")
    export.add_argument("--data-dir", type=Path, default=Path(os.environ.get("GPUPOOL_DATA_DIR", ".gpupool")))
    export.add_argument("--store", type=Path, default=None,
                        help="where the seeds are kept (default <data-dir>/secrets/nats)")
    export.add_argument("--node", type=parse_node, action="append", default=[], metavar="CLUSTER/NODE",
                        help="a node's identity to include (repeatable; compose default: its simulated fleet)")
    export.add_argument("--namespace", default="gpupool", help="the Secrets' namespace (kubernetes)")
    export.add_argument("--cluster", default="local", help="the simulated fleet's cluster (compose)")
    export.add_argument("--sim-fleet", default=DEFAULT_SIM_FLEET, help="the simulated fleet (compose)")
    export.set_defaults(func=cmd_export)
    prov = verbs.add_parser("provision", help="declare the streams and the leases bucket as the supervisor")
    prov.add_argument("--url", required=True, help="NATS URL(s), comma-separated")
    prov.add_argument("--nkey-file", required=True, help="the supervisor's seed file")
    prov.add_argument("--replicas", type=int, default=1, choices=(1, 3, 5))
    prov.add_argument("--timeout", type=float, default=120.0, help="keep trying this long (s)")
    prov.set_defaults(func=cmd_provision)
