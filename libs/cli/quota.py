"""Who may use how much, and when a person decides: `gpupool teams | quota | priority-classes | approvals |
reclaim-policies`."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from libs.cli.common import (
    APPROVAL_RULES,
    APPROVAL_STATES,
    EXIT_OK,
    JOB_KINDS,
    Adder,
    UsageError,
    parse_duration,
)
from libs.cli.render import cell, emit, fmt_age, fmt_duration, fmt_time, num, raws, short, table
from libs.client import GpupoolClient
from libs.client.models import QuotaEntry


def cmd_teams(args: argparse.Namespace, gp: GpupoolClient) -> int:
    teams = gp.list_teams()

    def render() -> str:
        if not teams:
            return "No teams."
        return table(["TEAM", "ORG", "QUOTAS (model guaranteed/borrowing limit)"],
                     [[t.team, t.org, "; ".join(f"{q.gpu_model} {cell(num(q.guaranteed))}/"
                                                f"{cell(num(q.borrowing_limit)) if q.borrowing_limit is not None else 'unlimited'}"
                                                for q in t.quotas) or None] for t in teams])

    emit(args, raws(teams), render)
    return EXIT_OK


def cmd_teams_create(args: argparse.Namespace, gp: GpupoolClient) -> int:
    team = gp.create_team(args.name, org=args.org)
    emit(args, team.raw, lambda: f"team {team.team} (org {team.org}); give it a quota: "
                                 f"gpupool quota set {team.org}/{team.team} --model MODEL --guaranteed N")
    return EXIT_OK


# --- quotas, priority classes, approvals, reclaim policies ------------------------------------------------------------
def parse_limit(text: str) -> float | None:
    """A GPU count, or "unlimited"/"none" (borrowing) / "all" (lending): no limit."""
    if text.strip().lower() in ("unlimited", "none", "all", "null", "-"):
        return None
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of GPUs (or 'unlimited')") from None
    if value < 0:
        raise argparse.ArgumentTypeError("must not be negative")
    return value


def _limit(value: float | None, none: str) -> Any:
    return none if value is None else num(value)


def quotas_table(entries: Sequence[QuotaEntry]) -> str:
    if not entries:
        return "No quota entries."
    return table(["PATH", "MODEL", "GUARANTEED", "BORROWING LIMIT", "LENDING LIMIT", "WEIGHT", "UPDATED"],
                 [[q.path, q.gpu_model, num(q.guaranteed), _limit(q.borrowing_limit, "unlimited"),
                   _limit(q.lending_limit, "all unused"), num(q.weight), q.updated_at] for q in entries])


def cmd_quota_list(args: argparse.Namespace, gp: GpupoolClient) -> int:
    entries = gp.list_quotas()
    emit(args, raws(entries), lambda: quotas_table(entries))
    return EXIT_OK


_UNSET: Any = object()  # a flag that was not given (None means "no limit" for the limits)


def cmd_quota_set(args: argparse.Namespace, gp: GpupoolClient) -> int:
    """Changes only the fields given; the others keep the entry's current values (or the defaults for a new one)."""
    current = next((q for q in gp.list_quotas() if q.path == args.path and q.gpu_model == args.model), None)
    fields = {"guaranteed": current.guaranteed if current else 0.0,
              "borrowing_limit": current.borrowing_limit if current else None,
              "lending_limit": current.lending_limit if current else None,
              "weight": current.weight if current else 1.0}
    for key in fields:
        value = getattr(args, key)
        if value is not _UNSET:
            fields[key] = value
    if fields["guaranteed"] < 0 or fields["weight"] <= 0:
        raise UsageError("--guaranteed must not be negative and --weight must be positive")
    entry = gp.set_quota(args.path, args.model, **fields)
    emit(args, entry.raw, lambda: (
        f"quota {entry.path} {entry.gpu_model}: guaranteed {cell(num(entry.guaranteed))} · borrowing limit "
        f"{cell(_limit(entry.borrowing_limit, 'unlimited'))} · lending limit "
        f"{cell(_limit(entry.lending_limit, 'all unused'))} · weight {cell(num(entry.weight))}"))
    return EXIT_OK


def cmd_quota_delete(args: argparse.Namespace, gp: GpupoolClient) -> int:
    gp.delete_quota(args.path, args.model)
    emit(args, {"path": args.path, "gpu_model": args.model, "deleted": True},
         lambda: f"quota {args.path} {args.model} deleted")
    return EXIT_OK


def parse_until(text: str, now: datetime | None = None) -> datetime:
    """An end date: ISO 8601 ('2026-12-24', '2026-12-24T18:00Z') or a duration from now ('7d', '12h')."""
    now = now or datetime.now(UTC)
    try:
        return now + timedelta(seconds=parse_duration(text))
    except UsageError:
        pass
    try:
        when = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise UsageError(f"--until must be a date (2026-12-24) or a duration (7d), not {text!r}") from None
    return when if when.tzinfo else when.replace(tzinfo=UTC)


def cmd_quota_loan(args: argparse.Namespace, gp: GpupoolClient) -> int:
    request = gp.request_quota_loan(args.path, args.gpus, parse_until(args.until), args.reason, args.model)
    emit(args, request, lambda: (f"asked for a loan of {args.gpus} {args.model} GPU(s) to {args.path} until "
                                 f"{request['loan_until']}\n  a platform admin decides: gpupool approvals approve "
                                 f"{request['approval_id']}"))
    return EXIT_OK


def cmd_quota_loans(args: argparse.Namespace, gp: GpupoolClient) -> int:
    loans = gp.list_quota_loans(active=args.active)
    emit(args, loans, lambda: table(("PATH", "MODEL", "GPUS", "UNTIL", "ACTIVE", "GRANTED BY", "REASON"), [
        (x["path"], x["gpu_model"], x["gpus"], x["until"], "yes" if x["active"] else "no", x["granted_by"],
         short(x["reason"], 40)) for x in loans]) if loans else "No quota loans.")
    return EXIT_OK


def cmd_priority_classes_list(args: argparse.Namespace, gp: GpupoolClient) -> int:
    classes = gp.list_priority_classes()
    emit(args, raws(classes), lambda: table(
        ["NAME", "VALUE", "PREEMPTIBLE", "MIN RUNTIME", "DESCRIPTION"],
        [[c.name, c.value, c.preemptible, fmt_duration(c.min_runtime_s), c.description] for c in classes])
        if classes else "No priority classes.")
    return EXIT_OK


def cmd_priority_classes_set(args: argparse.Namespace, gp: GpupoolClient) -> int:
    """Changes only the fields given; a new class needs --value and --preemptible or --no-preemptible."""
    current = next((c for c in gp.list_priority_classes() if c.name == args.name), None)
    if current is None and (args.value is None or args.preemptible is None):
        raise UsageError(f"priority class {args.name!r} is new: give --value and --preemptible or --no-preemptible")
    value = args.value if args.value is not None else current.value  # type: ignore[union-attr]
    preemptible = args.preemptible if args.preemptible is not None else current.preemptible  # type: ignore[union-attr]
    min_runtime = current.min_runtime_s if current else None
    if args.min_runtime is not None:
        min_runtime = None if args.min_runtime.strip().lower() in ("none", "0") else parse_duration(args.min_runtime)
    description = args.description if args.description is not None else (current.description if current else "")
    pc = gp.set_priority_class(args.name, value, preemptible, min_runtime_s=min_runtime, description=description)
    emit(args, pc.raw, lambda: (
        f"priority class {pc.name}: value {pc.value} · {'preemptible' if pc.preemptible else 'not preemptible'}"
        + (f" · min runtime {fmt_duration(pc.min_runtime_s)}" if pc.min_runtime_s else "")
        + (f" · {pc.description}" if pc.description else "")))
    return EXIT_OK


def _rule_text(rule: Any) -> str:
    shown = fmt_duration(float(rule.value)) if rule.rule == "runtime_over_s" and _is_number(rule.value) else rule.value
    return f"{rule.rule} {shown} ({'enabled' if rule.enabled else 'disabled'})"


def _is_number(text: str) -> bool:
    try:
        float(text)
    except (TypeError, ValueError):
        return False
    return True


def cmd_approvals_list(args: argparse.Namespace, gp: GpupoolClient) -> int:
    if args.limit is not None and args.limit <= 0:
        raise UsageError("--limit must be positive")
    items = gp.list_approvals(team=args.team, state=args.state, limit=args.limit, kind=args.kind)

    def render() -> str:
        rules = gp.approval_rules()
        foot = "rules: " + ("; ".join(_rule_text(r) for r in rules) if rules else "none (nothing needs approval)")
        if not items:
            return f"No approval requests.\n\n{foot}"
        body = table(["APPROVAL ID", "JOB ID", "NAME", "TEAM", "GPUS", "PRIORITY", "REASONS", "REQUESTED BY",
                      "STATE", "DECIDED BY", "AGE"],
                     [[a.approval_id, a.job_id or a.kind, a.job_name if a.kind != "loan" else _loan_text(a), a.team,
                       a.gpus, a.priority_class, "; ".join(a.reasons), a.requested_by, a.state, a.decided_by,
                       fmt_age(a.created_at)] for a in items])
        return f"{body}\n\n{foot}"

    emit(args, raws(items), render)
    return EXIT_OK


def _loan_text(a) -> str:  # type: ignore[no-untyped-def]
    """A quota loan's request in a few words: what it lends, of which model, until when."""
    return f"loan to {a.loan_path} ({a.loan_gpu_model or 'any model'}) until {fmt_time(a.loan_until)} UTC"


def cmd_approvals_decide(args: argparse.Namespace, gp: GpupoolClient) -> int:
    approve = args.approvals_command == "approve"
    a = gp.approve(args.approval_id, args.comment) if approve else gp.deny(args.approval_id, args.comment)
    if a.kind == "loan":
        outcome = "the guarantee is lent" if approve else "nothing is lent"
        emit(args, a.raw, lambda: f"approval {a.approval_id} {a.state}: {a.gpus} GPU(s) {_loan_text(a)}: {outcome}")
        return EXIT_OK
    outcome = "joins the queue" if approve else "fails with ApprovalDenied"
    emit(args, a.raw, lambda: f"approval {a.approval_id} {a.state}: job {a.job_id} ({a.team}/{a.job_name}) {outcome}")
    return EXIT_OK


def cmd_approvals_rule(args: argparse.Namespace, gp: GpupoolClient) -> int:
    value = args.value
    if value is None:
        if not args.disable:
            raise UsageError(f"give the rule's VALUE (e.g. gpupool approvals rule {args.rule} 8), or --disable")
        current = next((r for r in gp.approval_rules() if r.rule == args.rule), None)
        if current is None:
            raise UsageError(f"rule {args.rule} was never set; nothing to disable")
        value = current.value
    elif args.rule == "runtime_over_s":
        value = f"{parse_duration(value):g}"  # "8h" → "28800"
    rule = gp.set_approval_rule(args.rule, value, enabled=not args.disable)
    emit(args, rule.raw, lambda: f"rule {_rule_text(rule)}")
    return EXIT_OK


def reclaim_table(policies: Sequence[Any]) -> str:
    if not policies:
        return "No reclaim policies."
    return table(["KIND", "IDLE AFTER", "IDLE BELOW %", "GRACE", "ENFORCE MAX RUNTIME", "UPDATED"],
                 [[p.kind, fmt_duration(p.idle_after_s) or "never", num(p.idle_util_pct), fmt_duration(p.grace_s),
                   p.enforce_max_runtime, p.updated_at] for p in sorted(policies, key=lambda p: p.kind)])


def cmd_reclaim_list(args: argparse.Namespace, gp: GpupoolClient) -> int:
    policies = gp.list_reclaim_policies()
    emit(args, raws(policies), lambda: reclaim_table(policies))
    return EXIT_OK


def cmd_reclaim_set(args: argparse.Namespace, gp: GpupoolClient) -> int:
    """Changes only the fields given; the others keep the kind's current policy (or the defaults)."""
    current = next((p for p in gp.list_reclaim_policies() if p.kind == args.kind), None)
    fields: dict[str, Any] = {"idle_after_s": current.idle_after_s if current else None,
                              "idle_util_pct": current.idle_util_pct if current else 5.0,
                              "grace_s": current.grace_s if current else 300.0,
                              "enforce_max_runtime": current.enforce_max_runtime if current else True}
    if args.idle_after is not None:
        never = args.idle_after.strip().lower() in ("never", "none", "off")
        fields["idle_after_s"] = None if never else parse_duration(args.idle_after)
    if args.idle_util_pct is not None:
        if not 0 <= args.idle_util_pct <= 100:
            raise UsageError("--idle-util-pct must be between 0 and 100")
        fields["idle_util_pct"] = args.idle_util_pct
    if args.grace is not None:
        fields["grace_s"] = parse_duration(args.grace)
    if args.enforce_max_runtime is not None:
        fields["enforce_max_runtime"] = args.enforce_max_runtime
    p = gp.set_reclaim_policy(args.kind, **fields)
    emit(args, p.raw, lambda: (
        f"reclaim policy {p.kind}: "
        + (f"idle below {cell(num(p.idle_util_pct))}% for {fmt_duration(p.idle_after_s)} → warned, reclaimed after "
           f"{fmt_duration(p.grace_s)} grace" if p.idle_after_s else "never reclaimed for idleness")
        + f" · max runtime {'enforced' if p.enforce_max_runtime else 'not enforced'}"))
    return EXIT_OK


def _group(sub: argparse._SubParsersAction, name: str, text: str, dest: str,
           choices: str) -> argparse._SubParsersAction:
    g = sub.add_parser(name, help=text, description=text)
    return g.add_subparsers(dest=dest, required=True, metavar="{" + choices + "}")


def register(sub: argparse._SubParsersAction, add: Adder) -> None:
    """gpupool teams | quota, then the policies: priority-classes | approvals | reclaim-policies."""
    teams = add("teams", cmd_teams, "teams and their quotas (`teams create NAME` adds one)")
    teams_sub = teams.add_subparsers(dest="teams_command", metavar="{list,create}")
    add("list", cmd_teams, "teams and their quotas", teams_sub)
    p = add("create", cmd_teams_create, "create a team (and its org) (admins)", teams_sub)
    p.add_argument("name", metavar="NAME")
    p.add_argument("--org", help="the org it belongs to (default: default)")

    quota = _group(sub, "quota", "quota entries of the org → team → project tree, in GPUs", "quota_command",
                   "list,set,delete,loan,loans")
    add("list", cmd_quota_list, "every quota entry", quota)
    p = add("set", cmd_quota_set, "set one quota entry; fields not given keep their value (admins)", quota)
    p.add_argument("path", metavar="PATH", help="org, org/team or org/team/project, e.g. default/research")
    p.add_argument("--model", default="*", help="GPU model, '*' (the default) for any model")
    p.add_argument("--guaranteed", type=float, default=_UNSET, metavar="GPUS", help="GPUs guaranteed")
    p.add_argument("--borrowing-limit", type=parse_limit, default=_UNSET, metavar="GPUS",
                   help="GPUs it may borrow beyond its guarantee, or 'unlimited'")
    p.add_argument("--lending-limit", type=parse_limit, default=_UNSET, metavar="GPUS",
                   help="unused guaranteed GPUs it lends to others, or 'all'")
    p.add_argument("--weight", type=float, default=_UNSET, help="over-quota fair-share weight (default 1)")
    p = add("delete", cmd_quota_delete, "remove one quota entry (admins)", quota)
    p.add_argument("path", metavar="PATH")
    p.add_argument("--model", default="*", help="GPU model, '*' (the default) for any model")
    p = add("loan", cmd_quota_loan, "ask for extra guarantee until a date (team admins; a platform admin approves)",
            quota)
    p.add_argument("path", metavar="PATH", help="org/team or org/team/project, e.g. default/research")
    p.add_argument("--gpus", type=int, required=True, help="extra guaranteed GPUs")
    p.add_argument("--until", required=True, metavar="WHEN", help="a date (2026-12-24) or a duration (7d, 12h)")
    p.add_argument("--reason", required=True)
    p.add_argument("--model", default="*", help="GPU model, '*' (the default) for any model")
    p = add("loans", cmd_quota_loans, "quota loans granted", quota)
    p.add_argument("--active", action="store_true", help="only those in force now")
    register_policies(sub, add)


def register_policies(sub: argparse._SubParsersAction, add: Adder) -> None:
    """gpupool priority-classes | approvals | reclaim-policies."""
    classes = _group(sub, "priority-classes", "priority classes: higher value runs first", "pc_command", "list,set")
    add("list", cmd_priority_classes_list, "every priority class", classes)
    p = add("set", cmd_priority_classes_set, "create or change a priority class; fields not given keep their value "
                                             "(admins)", classes)
    p.add_argument("name", metavar="NAME")
    p.add_argument("--value", type=int, help="higher runs first")
    p.add_argument("--preemptible", action=argparse.BooleanOptionalAction, default=None,
                   help="whether jobs of this class may be preempted")
    p.add_argument("--min-runtime", metavar="DURATION", help="run at least this long before preemption, or none")
    p.add_argument("--description")

    approvals = _group(sub, "approvals", "approval requests and the rules that send big jobs to them",
                       "approvals_command", "list,approve,deny,rule")
    p = add("list", cmd_approvals_list, "approval requests (newest first) and the rules in force", approvals)
    p.add_argument("--team")
    p.add_argument("--state", choices=APPROVAL_STATES)
    p.add_argument("--kind", choices=("job", "loan"), help="only jobs held for approval, or only quota loans")
    p.add_argument("--limit", type=int, help="show at most this many")
    for verb, text in (("approve", "approve a request: its job joins the queue"),
                       ("deny", "deny a request: its job fails with ApprovalDenied")):
        p = add(verb, cmd_approvals_decide, text, approvals)
        p.add_argument("approval_id", metavar="APPROVAL_ID")
        p.add_argument("--comment", default="", help="recorded with the decision")
    p = add("rule", cmd_approvals_rule, "set an admission rule that requires approval (admins)", approvals)
    p.add_argument("rule", metavar="RULE", choices=APPROVAL_RULES,
                   help="gpus_over (GPUs), runtime_over_s (declared max runtime; 8h works) or priority_class")
    p.add_argument("value", metavar="VALUE", nargs="?", help="the threshold or class name")
    p.add_argument("--disable", action="store_true", help="stop applying the rule (keeps its value)")

    reclaim = _group(sub, "reclaim-policies", "what is taken back, per job kind", "reclaim_command", "list,set")
    add("list", cmd_reclaim_list, "the policy of every job kind", reclaim)
    p = add("set", cmd_reclaim_set, "set a kind's policy; fields not given keep their value (admins)", reclaim)
    p.add_argument("kind", metavar="KIND", choices=JOB_KINDS)
    p.add_argument("--idle-after", metavar="DURATION", help="warn after this long idle, e.g. 30m, or 'never'")
    p.add_argument("--idle-util-pct", type=float, metavar="PCT", help="idle means GPU utilization below this")
    p.add_argument("--grace", metavar="DURATION", help="time between the warning and the reclaim")
    p.add_argument("--enforce-max-runtime", action=argparse.BooleanOptionalAction, default=None,
                   help="end jobs that run past their declared --max-runtime")
