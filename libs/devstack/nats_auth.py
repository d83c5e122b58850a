"""Per-service NATS credentials for the embedded server: deploy/nats/permissions.yaml → an authorization block.

Each service gets its own user and a random password; an `admin` user (for people and tests) may do anything.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass
from pathlib import Path

import yaml

PERMISSIONS_FILE = Path(__file__).resolve().parents[2] / "deploy" / "nats" / "permissions.yaml"


@dataclass(frozen=True, slots=True)
class NatsUser:
    name: str
    password: str
    publish: tuple[str, ...]
    subscribe: tuple[str, ...]


def jetstream_api(streams: list[str], consumers: dict[str, list[str]], kv: list[str]) -> tuple[str, ...]:
    """The JetStream API calls a service makes, as publish permissions: declare gpupool's streams, create and pull
    from its own durable consumers and acknowledge their messages, use its KV buckets. Nothing else (no deletes,
    no purges, no other service's consumers)."""
    out: list[str] = []
    for stream in streams:
        out += [f"$JS.API.STREAM.{verb}.{stream}" for verb in ("INFO", "CREATE", "UPDATE")]
    for stream, durables in consumers.items():
        for d in durables:
            out += [f"$JS.API.CONSUMER.INFO.{stream}.{d}", f"$JS.API.CONSUMER.CREATE.{stream}.{d}",
                    f"$JS.API.CONSUMER.CREATE.{stream}.{d}.>", f"$JS.API.CONSUMER.MSG.NEXT.{stream}.{d}",
                    # acks: the classic reply subject, and the form with domain and account hash tokens
                    f"$JS.ACK.{stream}.{d}.>", f"$JS.ACK.*.*.{stream}.{d}.>"]
    for bucket in kv:
        stream = f"KV_{bucket}"
        out += [f"$JS.API.STREAM.INFO.{stream}", f"$JS.API.STREAM.CREATE.{stream}",
                f"$JS.API.STREAM.MSG.GET.{stream}", f"$JS.API.DIRECT.GET.{stream}.>"]
    return tuple(out)


def load_users(permissions_file: Path = PERMISSIONS_FILE, passwords: dict[str, str] | None = None) -> list[NatsUser]:
    doc = yaml.safe_load(permissions_file.read_text())
    common = doc.get("common", {})
    passwords = dict(passwords or {})
    users = []
    for name, perms in doc["services"].items():
        api = jetstream_api(list(common.get("streams", [])), dict(perms.get("consumers") or {}),
                            list(perms.get("kv") or []))
        users.append(NatsUser(
            name=name,
            password=passwords.get(name) or secrets.token_urlsafe(24),
            publish=tuple(common.get("publish", [])) + api + tuple(perms.get("publish", [])),
            subscribe=tuple(common.get("subscribe", [])) + tuple(perms.get("subscribe", [])),
        ))
    return users


def render_config(users: list[NatsUser], admin_password: str) -> str:
    """A nats-server config fragment (JSON is valid nats-server config syntax, and quoting stays exact)."""
    entries = [{"user": "admin", "password": admin_password}]
    for u in users:
        entries.append({"user": u.name, "password": u.password,
                        "permissions": {"publish": {"allow": list(u.publish)},
                                        "subscribe": {"allow": list(u.subscribe)}}})
    return "authorization " + json.dumps({"users": entries}, indent=2) + "\n"


def write_config(path: Path, users: list[NatsUser], admin_password: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_config(users, admin_password))
    path.chmod(0o600)
    return path
