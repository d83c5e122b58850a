"""`gpupool creds`: issue a real node's NATS identity (or show any identity's) for an installation of `gpupool up`.

A node's identity `agent-<cluster>-<node>` may publish telemetry, agent events and its registration only on its own
subjects. The seed file (`.nk`, mode 0600) is the node's secret: copy it to the node, nowhere else. If the platform
is running, its NATS server is told to reload its configuration (SIGHUP), so the node may connect at once.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from pathlib import Path

from libs.contracts import subjects
from libs.devstack.nats_auth import AUTH_CONFIG, IdentityStore, write_config
from libs.devstack.private import write_private


def admin_password(data_dir: Path) -> str | None:
    """The admin password of the installation's current NATS configuration (regenerated at every `gpupool up`)."""
    path = data_dir / AUTH_CONFIG
    if not path.exists():
        return None
    doc = json.loads(path.read_text().partition("authorization ")[2])
    return next((u["password"] for u in doc["users"] if u.get("user") == "admin"), None)


def reload_servers(data_dir: Path) -> list[int]:
    """SIGHUP to each running NATS server of the installation (nats-server rereads its configuration)."""
    from libs.devstack.stack import read_run_file

    run = read_run_file(data_dir) or {}
    pids = [s["pid"] for name, s in (run.get("servers") or {}).items() if name.startswith("nats") and s.get("pid")]
    reloaded = []
    for pid in pids:
        try:
            os.kill(pid, signal.SIGHUP)
            reloaded.append(pid)
        except ProcessLookupError:
            pass
    return reloaded


def issue(data_dir: Path, cluster: str, node: str) -> tuple[Path, bool]:
    """The node's seed file, and whether a running server was told about it."""
    store = IdentityStore(data_dir / "secrets" / "nats")
    identity = store.node(cluster, node)
    password = admin_password(data_dir)
    if password is None:  # no installation yet: `gpupool up` will include it when it writes the configuration
        return identity.seed_file, False
    write_config(data_dir / AUTH_CONFIG, store.all(), password)
    return identity.seed_file, bool(reload_servers(data_dir))


def main(args: argparse.Namespace) -> int:
    data_dir = args.data_dir.resolve()
    if args.identity:
        store = IdentityStore(data_dir / "secrets" / "nats")
        path = store.directory / f"{args.identity}.nk"
        if not path.exists():
            print(f"gpupool creds: no identity {args.identity!r} in {store.directory}", file=sys.stderr)
            return 1
        print(path)
        return 0
    if not (args.cluster and args.node):
        print("gpupool creds: give --cluster and --node (a node's identity) or --identity NAME", file=sys.stderr)
        return 2
    try:
        seed, reloaded = issue(data_dir, args.cluster, args.node)
    except ValueError as exc:
        print(f"gpupool creds: {exc}", file=sys.stderr)
        return 1
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        seed = write_private(args.out, seed.read_bytes())
    identity = subjects.node_identity(args.cluster, args.node)
    state = "the running NATS server reloaded its configuration" if reloaded else \
        "`gpupool up` includes it at its next start"
    print(f"""# {identity}: {state}. Copy the seed file to the node (mode 0600), then run its agent with:
GPUPOOL_AGENT_CLUSTER={args.cluster}
GPUPOOL_AGENT_NODE={args.node}
GPUPOOL_AGENT_NATS_NKEY_FILE={seed}
GPUPOOL_AGENT_NATS_INBOX_PREFIX={subjects.inbox_prefix(identity)}
GPUPOOL_AGENT_DECLARE_STREAMS=false""")
    return 0


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("creds", help="issue a node's NATS identity (nkey seed) for a real node's agent",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data-dir", type=Path, default=Path(os.environ.get("GPUPOOL_DATA_DIR", ".gpupool")))
    p.add_argument("--cluster", help="the node's cluster (as its agent's GPUPOOL_AGENT_CLUSTER)")
    p.add_argument("--node", help="the node's name (as its agent's GPUPOOL_AGENT_NODE)")
    p.add_argument("--out", type=Path, default=None, help="also copy the seed file here (mode 0600)")
    p.add_argument("--identity", default=None,
                   help="instead: print the seed file of an existing identity (a service, supervisor, observer)")
    p.set_defaults(func=main)
