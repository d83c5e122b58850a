"""The same NATS identities as `gpupool up`, for deployments elsewhere: Kubernetes Secrets and compose files.

`gpupool up` renders deploy/nats/permissions.yaml for its own embedded server (libs/devstack/nats_auth.py). A
Kubernetes cluster or a compose host needs the same three things, written here from one identity store (the seeds
are made once and reused, so exporting again after adding a node keeps every other credential valid):

- the server's authorization block (`auth.conf`: public keys and permissions, plus the admin user's password),
- each service's, the supervisor's and the observer's seed, for that workload only,
- each node's seed, for that node only (a DaemonSet cannot hand a different Secret to each pod, so a node's seed
  is placed on the node itself, like a kubelet's credentials: `/etc/gpupool/nats/agent.nk`, mode 0600).
"""

from __future__ import annotations

import os
import secrets
from dataclasses import dataclass
from pathlib import Path

import yaml

from libs.devstack.nats_auth import Identity, IdentityStore, render_config
from libs.devstack.private import write_private

AUTH_SECRET = "nats-auth"  # Kubernetes: the server's authorization block (key auth.conf)
AUTH_KEY = "auth.conf"
SEED_KEY = "seed.nk"  # Kubernetes: each workload's Secret nats-identity-<name> holds its seed under this key
NODE_SEED_PATH = "/etc/gpupool/nats/agent.nk"  # Kubernetes: where a node's seed lies on the node
ADMIN_PASSWORD_FILE = "admin-password"  # in the store: stable across exports, so a re-export changes no password


def identity_secret(name: str) -> str:
    return f"nats-identity-{name}"


@dataclass(frozen=True, slots=True)
class Export:
    """What an export wrote: files for the operator to apply or mount, and each node's seed to copy to it."""

    files: list[Path]
    node_seeds: dict[str, Path]  # node identity → its seed file


def workload_identities(store: IdentityStore) -> list[Identity]:
    """The identities a workload (not a node) runs as: every service, the supervisor and the observer."""
    return [*store.services(), store.supervisor(), store.observer()]


def admin_password(store: IdentityStore) -> str:
    path = store.directory / ADMIN_PASSWORD_FILE
    if not path.exists():
        write_private(path, secrets.token_urlsafe(24))
    return path.read_text().strip()


def add_nodes(store: IdentityStore, nodes: list[tuple[str, str]]) -> None:
    for cluster, node in nodes:
        store.node(cluster, node)


def kubernetes_secrets(store: IdentityStore, namespace: str) -> list[dict]:
    """The Secrets deploy/kubernetes mounts: `nats-auth` for the NATS pods, `nats-identity-<name>` per workload."""
    def secret(name: str, data: dict[str, str], component: str) -> dict:
        return {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
                "metadata": {"name": name, "namespace": namespace,
                             "labels": {"app.kubernetes.io/part-of": "gpupool",
                                        "app.kubernetes.io/component": component}},
                "stringData": data}

    password = admin_password(store)
    docs = [secret(AUTH_SECRET, {AUTH_KEY: render_config(store.all(), password), ADMIN_PASSWORD_FILE: password},
                   "nats")]
    for ident in workload_identities(store):
        docs.append(secret(identity_secret(ident.name), {SEED_KEY: ident.seed_file.read_text()}, ident.name))
    return docs


def export_kubernetes(store: IdentityStore, out: Path, namespace: str = "gpupool") -> Export:
    """`<out>/nats-secrets.yaml` (kubectl apply -f; mode 0600) and `<out>/nodes/<identity>.nk` per node."""
    out.mkdir(parents=True, exist_ok=True, mode=0o700)
    manifest = write_private(out / "nats-secrets.yaml", yaml.dump_all(kubernetes_secrets(store, namespace),
                                                                      Dumper=_BlockDumper, sort_keys=False))
    return Export([manifest], _node_seeds(store, out / "nodes"))


def export_compose(store: IdentityStore, out: Path, owner: tuple[int, int] | None = None) -> Export:
    """docker-compose.yml's mounts: `<out>/nats/auth.conf`, `<out>/<name>.nk` per workload, `<out>/agent/` with the
    simulated fleet's node seeds. ``owner``: (uid, gid) the containers read them as (the image's user, 10001)."""
    out.mkdir(parents=True, exist_ok=True, mode=0o700)
    (out / "nats").mkdir(exist_ok=True, mode=0o700)
    files = [write_private(out / "nats" / AUTH_KEY, render_config(store.all(), admin_password(store)))]
    for ident in workload_identities(store):
        files.append(write_private(out / f"{ident.name}.nk", ident.seed_file.read_bytes(), owner=owner))
    seeds = _node_seeds(store, out / "agent", owner)
    if owner is not None:
        for directory in (out, out / "agent"):
            os.chown(directory, *owner)
    return Export(files, seeds)


class _BlockDumper(yaml.SafeDumper):
    """Multi-line strings (the authorization block) as YAML literal blocks, readable in a review."""


_BlockDumper.add_representer(str, lambda d, v: d.represent_scalar("tag:yaml.org,2002:str", v,
                                                                  style="|" if "\n" in v.strip() else None))


def _node_seeds(store: IdentityStore, directory: Path, owner: tuple[int, int] | None = None) -> dict[str, Path]:
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    return {ident.name: write_private(directory / f"{ident.name}.nk", ident.seed_file.read_bytes(), owner=owner)
            for ident in store.nodes()}

