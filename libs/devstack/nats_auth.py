"""NATS identities for the embedded server: deploy/nats/permissions.yaml → nkey users in an authorization block.

Every identity authenticates with its own nkey (NATS's standard: an ed25519 key pair; the seed file `<name>.nk`,
mode 0600, signs the server's nonce and never leaves the machine; the server knows only the public key):

- each service (`inventory` … `gateway`): publishes what it owns, subscribes to what it answers or consumes,
  looks up gpupool's streams and uses only its own durable consumers;
- each node's agent (`agent-<cluster>-<node>`): telemetry, agent events and its registration only on its own
  `<cluster>.<node>` subjects, reads of only its own logs;
- `supervisor`: the provisioning identity, the only one that may create or update streams and KV buckets;
- `observer`: may only subscribe to events (tools, dashboards).

Each identity receives replies only on its own inbox prefix (`_INBOX_<name>`), and answers requests through the
server's `allow_responses` (a reply to what it was asked, nothing else). An `admin` user with a password (for
people, tests and `gpupool check`) may do anything.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

import yaml

from libs.contracts import subjects
from libs.devstack.private import write_private

PERMISSIONS_FILE = Path(__file__).resolve().parents[2] / "deploy" / "nats" / "permissions.yaml"
SUPERVISOR, OBSERVER = "supervisor", "observer"
AUTH_CONFIG = "nats-auth.conf"  # in the data directory: the authorization block the embedded server includes
_SAFE = re.compile(r"^[A-Za-z0-9_-]{1,200}$")


@dataclass(frozen=True, slots=True)
class Identity:
    name: str
    public_key: str
    seed_file: Path
    publish: tuple[str, ...]
    subscribe: tuple[str, ...]
    deny_publish: tuple[str, ...] = ()

    @property
    def inbox(self) -> str:
        return subjects.inbox_prefix(self.name)


def jetstream_api(streams: list[str], consumers: dict[str, list[str]], kv: list[str]) -> tuple[str, ...]:
    """The JetStream API calls a service makes, as publish permissions: look up gpupool's streams, create and pull
    from its own durable consumers and acknowledge their messages, read its KV buckets. Nothing else (no stream
    created, changed, deleted or purged; no other service's consumers)."""
    out: list[str] = [f"$JS.API.STREAM.INFO.{stream}" for stream in streams]
    for stream, durables in consumers.items():
        for d in durables:
            out += [f"$JS.API.CONSUMER.INFO.{stream}.{d}", f"$JS.API.CONSUMER.CREATE.{stream}.{d}",
                    f"$JS.API.CONSUMER.CREATE.{stream}.{d}.>", f"$JS.API.CONSUMER.MSG.NEXT.{stream}.{d}",
                    # acks: the classic reply subject, and the form with domain and account hash tokens
                    f"$JS.ACK.{stream}.{d}.>", f"$JS.ACK.*.*.{stream}.{d}.>"]
    for bucket in kv:
        stream = f"KV_{bucket}"
        out += [f"$JS.API.STREAM.INFO.{stream}", f"$JS.API.STREAM.MSG.GET.{stream}", f"$JS.API.DIRECT.GET.{stream}.>"]
    return tuple(out)


def provisioning_api(streams: list[str], kv: list[str]) -> tuple[str, ...]:
    """What only the supervisor may do: create, look up and update gpupool's streams and KV buckets."""
    names = [*streams, *(f"KV_{b}" for b in kv)]
    return tuple(f"$JS.API.STREAM.{verb}.{name}" for name in names for verb in ("INFO", "CREATE", "UPDATE")) + (
        "$JS.API.INFO",)


class IdentityStore:
    """The seed files of one installation (`<data-dir>/secrets/nats/`, mode 0700): created once, reused at every
    start, so a node's credentials issued with `gpupool creds` keep working. `nodes.json` remembers which
    (cluster, node) each agent identity is for."""

    def __init__(self, directory: Path, permissions_file: Path = PERMISSIONS_FILE) -> None:
        self.directory = directory
        self.doc = yaml.safe_load(permissions_file.read_text())
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        directory.chmod(0o700)

    def seed(self, name: str) -> tuple[Path, str]:
        """(seed file, public key) of `name`, creating the key pair on first use."""
        import nkeys

        if not _SAFE.match(name):
            raise ValueError(f"unsafe identity name {name!r}")
        path = self.directory / f"{name}.nk"
        if not path.exists():
            write_private(path, nkeys.encode_seed(os.urandom(32), nkeys.PREFIX_BYTE_USER) + b"\n")
        path.chmod(0o600)
        pair = nkeys.from_seed(bytearray(path.read_bytes().strip()))
        try:
            return path, pair.public_key.decode()
        finally:
            pair.wipe()

    def _identity(self, name: str, publish: tuple[str, ...], subscribe: tuple[str, ...],
                  deny_publish: tuple[str, ...] = ()) -> Identity:
        path, public = self.seed(name)
        inbox = f"{subjects.inbox_prefix(name)}.>"
        return Identity(name, public, path, publish, (inbox, *subscribe), deny_publish)

    def services(self) -> list[Identity]:
        common = self.doc.get("common", {})
        out = []
        for name, perms in self.doc["services"].items():
            api = jetstream_api(list(common.get("streams", [])), dict(perms.get("consumers") or {}),
                                list(perms.get("kv") or []))
            out.append(self._identity(name, api + tuple(perms.get("publish", [])),
                                      tuple(perms.get("subscribe", [])), tuple(perms.get("deny_publish", []))))
        return out

    def node(self, cluster: str, node: str) -> Identity:
        """The identity of one node's agent (issued on first call): only its own subjects."""
        name = subjects.node_identity(cluster, node)
        self._remember(name, cluster, node)
        return self._node(name, cluster, node)

    def _node(self, name: str, cluster: str, node: str) -> Identity:
        tokens = {"cluster": subjects.token(cluster), "node": subjects.token(node)}
        perms = self.doc["agent_node"]
        streams = [f"$JS.API.STREAM.INFO.{s}" for s in self.doc.get("common", {}).get("streams", [])]
        return self._identity(name, tuple(streams) + tuple(p.format(**tokens) for p in perms["publish"]),
                              tuple(s.format(**tokens) for s in perms["subscribe"]))

    def nodes(self) -> list[Identity]:
        """Every node identity issued so far (by `gpupool up` for its simulated fleet, or `gpupool creds`)."""
        return [self._node(name, c, n) for name, (c, n) in sorted(self._known().items(), key=lambda kv: kv[1])]

    def supervisor(self) -> Identity:
        common = self.doc.get("common", {})
        kv = sorted({b for p in self.doc["services"].values() for b in (p.get("kv") or [])})
        return self._identity(SUPERVISOR, provisioning_api(list(common.get("streams", [])), kv), ())

    def observer(self) -> Identity:
        return self._identity(OBSERVER, (), tuple(self.doc["observer"]["subscribe"]))

    def all(self) -> list[Identity]:
        return [*self.services(), self.supervisor(), self.observer(), *self.nodes()]

    # --- which node each agent identity is for --------------------------------------------------------------
    def _known(self) -> dict[str, tuple[str, str]]:
        path = self.directory / "nodes.json"
        return {k: tuple(v) for k, v in json.loads(path.read_text()).items()} if path.exists() else {}  # type: ignore[misc]

    def _remember(self, name: str, cluster: str, node: str) -> None:
        known = self._known()
        if name in known:
            if known[name] != (cluster, node):
                raise ValueError(f"identity {name} already belongs to node {known[name][1]!r} of cluster "
                                 f"{known[name][0]!r}")
            return
        known[name] = (cluster, node)
        write_private(self.directory / "nodes.json", json.dumps({k: list(v) for k, v in sorted(known.items())},
                                                                indent=2))


def render_config(identities: list[Identity], admin_password: str) -> str:
    """A nats-server config fragment (JSON is valid nats-server config syntax, and quoting stays exact)."""
    entries: list[dict] = [{"user": "admin", "password": admin_password}]
    for ident in identities:
        publish: dict = {"allow": list(ident.publish)} if ident.publish else {"deny": [">"]}
        if ident.publish and ident.deny_publish:
            publish["deny"] = list(ident.deny_publish)
        entries.append({"nkey": ident.public_key,
                        "permissions": {"publish": publish,
                                        "subscribe": {"allow": list(ident.subscribe)},
                                        "allow_responses": True}})
    return "authorization " + json.dumps({"users": entries}, indent=2) + "\n"


def write_config(path: Path, identities: list[Identity], admin_password: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    return write_private(path, render_config(identities, admin_password))
