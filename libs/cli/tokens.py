"""Who may call the API and what they did: `gpupool token create | list | revoke`, `gpupool audit`, `gpupool
whoami`."""

from __future__ import annotations

import argparse
from datetime import UTC, datetime
from typing import Any

from libs.cli.common import EXIT_OK, ROLES, Adder, UsageError
from libs.cli.render import emit, key_values, raws, short, table
from libs.client import GpupoolClient


def cmd_token_create(args: argparse.Namespace, gp: GpupoolClient) -> int:
    if args.expires_in_days is not None and args.expires_in_days <= 0:
        raise UsageError("--expires-in-days must be a positive number of days")
    tok = gp.create_token(args.name, args.role, team=args.team, expires_in_days=args.expires_in_days,
                          never_expires=args.never_expires)
    emit(args, tok.raw, lambda: (
        key_values([("Token ID", tok.token_id), ("Name", tok.name), ("Role", tok.role), ("Team", tok.team),
                    ("Expires", tok.expires_at or "never")])
        + f"\n\nSecret (shown only this once; store it now):\n  {tok.token}"))
    return EXIT_OK


def _token_status(t: Any) -> str:
    if t.revoked_at:
        return "revoked"
    if t.expires_at and t.expires_at <= datetime.now(UTC):
        return "expired"
    return "active"


def cmd_token_list(args: argparse.Namespace, gp: GpupoolClient) -> int:
    tokens = gp.list_tokens()
    emit(args, raws(tokens), lambda: table(
        ["TOKEN ID", "NAME", "ROLE", "TEAM", "STATUS", "CREATED BY", "EXPIRES", "LAST USED"],
        [[t.token_id, t.name, t.role, t.team, _token_status(t), t.created_by, t.expires_at or "never",
          t.last_used_at] for t in tokens]) if tokens else "No tokens.")
    return EXIT_OK


def cmd_token_revoke(args: argparse.Namespace, gp: GpupoolClient) -> int:
    gp.revoke_token(args.token_id)
    emit(args, {"token_id": args.token_id, "revoked": True}, lambda: f"token {args.token_id} revoked")
    return EXIT_OK


def cmd_audit(args: argparse.Namespace, gp: GpupoolClient) -> int:
    if args.limit <= 0:
        raise UsageError("--limit must be positive")
    entries = gp.audit(limit=args.limit, action=args.action)
    emit(args, raws(entries), lambda: table(
        ["AT", "ACTOR", "ROLE", "ACTION", "TARGET", "BEFORE", "AFTER"],
        [[e.at, e.actor, e.actor_role, e.action, e.target, short(e.before, 40), short(e.after, 40)]
         for e in entries]) if entries else "No audit entries.")
    return EXIT_OK


def cmd_whoami(args: argparse.Namespace, gp: GpupoolClient) -> int:
    me = gp.whoami()
    emit(args, me.raw, lambda: key_values([("Subject", me.subject), ("Role", me.role), ("Team", me.team),
                                           ("Via", me.via), ("Gateway", gp.base_url),
                                           ("Allowed", ", ".join(me.allowed) or None)]))
    return EXIT_OK


def register(sub: argparse._SubParsersAction, add: Adder) -> None:
    """gpupool token create | list | revoke, audit, whoami."""
    token = sub.add_parser("token", help="API tokens: create, list, revoke (admins)",
                           description="API tokens: create, list, revoke (admins)")
    token_sub = token.add_subparsers(dest="token_command", required=True, metavar="{create,list,revoke}")
    p = add("create", cmd_token_create, "create a token; its secret is shown once", token_sub)
    p.add_argument("--name", required=True)
    p.add_argument("--role", required=True, choices=ROLES)
    p.add_argument("--team", help="the team a team-admin/member/viewer token acts for")
    exp = p.add_mutually_exclusive_group()
    exp.add_argument("--expires-in-days", type=int, help="default: the gateway's (90 days)")
    exp.add_argument("--never-expires", action="store_true", help="a token without expiry")
    add("list", cmd_token_list, "list tokens (never their secrets)", token_sub)
    p = add("revoke", cmd_token_revoke, "revoke a token now", token_sub)
    p.add_argument("token_id", metavar="TOKEN_ID")

    p = add("audit", cmd_audit, "the audit log of administrative actions, newest as the gateway orders them")
    p.add_argument("--limit", type=int, default=50, help="at most this many entries (default 50)")
    p.add_argument("--action", help="only this action, e.g. token.create")

    add("whoami", cmd_whoami, "who the token authenticates as, and what it may do")
