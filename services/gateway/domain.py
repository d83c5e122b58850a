"""Who may do what (roles × actions, scoped to a team), tokens, and RFC 9457 problem details.

Authorization is data: `POLICY` maps each action to the roles allowed and whether they are limited to their own
team. A test walks every endpoint × role against this table.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass
from enum import StrEnum
from typing import Literal

PROBLEM_TYPE_BASE = "https://gpupool.dev/problems/"
PROBLEM_CONTENT_TYPE = "application/problem+json"

Role = Literal["platform-admin", "operator", "team-admin", "member", "viewer", "service"]
ROLES: tuple[Role, ...] = ("platform-admin", "operator", "team-admin", "member", "viewer", "service")
TOKEN_PREFIX = "gpt_"


class Action(StrEnum):
    JOB_SUBMIT = "job.submit"
    JOB_READ = "job.read"
    JOB_CANCEL = "job.cancel"
    JOB_COMPLETE = "job.complete"
    POOL_READ = "pool.read"
    USAGE_READ = "usage.read"
    TEAM_READ = "team.read"
    TOKEN_MANAGE = "token.manage"
    AUDIT_READ = "audit.read"
    QUOTA_MANAGE = "quota.manage"
    APPROVAL_DECIDE = "approval.decide"
    NODE_MANAGE = "node.manage"
    DECISION_READ = "decision.read"
    QUOTA_LOAN_REQUEST = "quota_loan.request"


ANY, TEAM = "any", "team"  # scope: every team, or only the principal's own team

POLICY: dict[Action, dict[Role, str]] = {
    Action.JOB_SUBMIT: {"platform-admin": ANY, "team-admin": TEAM, "member": TEAM, "service": TEAM},
    Action.JOB_READ: {"platform-admin": ANY, "operator": ANY, "team-admin": TEAM, "member": TEAM, "viewer": TEAM,
                      "service": TEAM},
    Action.JOB_CANCEL: {"platform-admin": ANY, "operator": ANY, "team-admin": TEAM, "member": TEAM,
                        "service": TEAM},
    Action.JOB_COMPLETE: {"platform-admin": ANY, "team-admin": TEAM, "member": TEAM, "service": TEAM},
    Action.POOL_READ: {role: ANY for role in ROLES},
    Action.USAGE_READ: {"platform-admin": ANY, "operator": ANY, "team-admin": TEAM, "member": TEAM, "viewer": TEAM,
                        "service": TEAM},
    Action.TEAM_READ: {role: ANY for role in ROLES},
    Action.TOKEN_MANAGE: {"platform-admin": ANY, "team-admin": TEAM},
    Action.AUDIT_READ: {"platform-admin": ANY},
    Action.QUOTA_MANAGE: {"platform-admin": ANY},
    Action.APPROVAL_DECIDE: {"platform-admin": ANY, "team-admin": TEAM},
    Action.NODE_MANAGE: {"platform-admin": ANY, "operator": ANY},
    Action.DECISION_READ: {"platform-admin": ANY, "operator": ANY},
    Action.QUOTA_LOAN_REQUEST: {"platform-admin": ANY, "team-admin": TEAM},
}

# Roles a team admin may hand out inside their own team (never admin or operator).
TEAM_ADMIN_GRANTABLE: frozenset[str] = frozenset({"team-admin", "member", "viewer", "service"})


@dataclass(frozen=True, slots=True)
class Principal:
    """An authenticated caller. `team` None means not bound to a team (admins, operators, cross-team services)."""

    subject: str
    role: Role
    team: str | None
    via: Literal["bootstrap", "token", "oidc"]
    token_id: str | None = None

    def scope(self, action: Action) -> str | None:
        """ANY, TEAM, or None when the role may not do this at all. A team-scoped role without a team (an OIDC
        token without a team claim) may do nothing team-scoped; only a team-less service *API token*, which a
        platform admin minted on purpose, acts across teams."""
        scope = POLICY[action].get(self.role)
        if scope == TEAM and self.team is None:
            return ANY if self.role == "service" and self.via == "token" else None
        return scope

    @property
    def identity(self) -> str:
        """Who this caller is for keys it chooses (Idempotency-Key), stable across its requests: one API token,
        one OIDC subject, or the bootstrap admin."""
        if self.via == "token":
            return f"token:{self.token_id}"
        return f"{self.via}:{self.subject}"

    def may(self, action: Action, team: str | None = None) -> bool:
        scope = self.scope(action)
        if scope is None:
            return False
        if scope == ANY or team is None:
            return True
        return team == self.team


class Forbidden(Exception):
    def __init__(self, principal: Principal, action: Action, team: str | None = None) -> None:
        where = f" for team {team!r}" if team else ""
        super().__init__(f"role {principal.role!r} may not {action.value}{where}")
        self.action = action


def mint_token(token_id: str | None = None) -> tuple[str, str, str]:
    """(token_id, full token shown once, hash to store). The secret has 256 bits, so SHA-256 is enough."""
    token_id = token_id or secrets.token_hex(8)
    secret = secrets.token_urlsafe(32)
    return token_id, f"{TOKEN_PREFIX}{token_id}.{secret}", hash_secret(secret)


def split_token(token: str) -> tuple[str, str] | None:
    if not token.startswith(TOKEN_PREFIX) or "." not in token:
        return None
    token_id, _, secret = token[len(TOKEN_PREFIX):].partition(".")
    return (token_id, secret) if token_id and secret else None


def hash_secret(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def secret_matches(secret: str, stored_hash: str) -> bool:
    return hmac.compare_digest(hash_secret(secret), stored_hash)
