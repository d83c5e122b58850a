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


def load_users(permissions_file: Path = PERMISSIONS_FILE, passwords: dict[str, str] | None = None) -> list[NatsUser]:
    doc = yaml.safe_load(permissions_file.read_text())
    common = doc.get("common", {})
    passwords = dict(passwords or {})
    users = []
    for name, perms in doc["services"].items():
        users.append(NatsUser(
            name=name,
            password=passwords.get(name) or secrets.token_urlsafe(24),
            publish=tuple(common.get("publish", [])) + tuple(perms.get("publish", [])),
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
