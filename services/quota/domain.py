"""Admission rules applied at submit time. Each refusal carries a machine reason and a human message."""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any, Protocol

from libs.contracts.names import NAME_PATTERN
from libs.domain import Refusal


class Submission(Protocol):
    """What admission reads of a submitted job (the queue's admission request carries these)."""

    team: str
    priority_class: str
    gpus: int
    gpu_models: Sequence[str]
    max_runtime_s: float | None


def ceiling(entries: Iterable[Mapping[str, Any]], model: str) -> float | None:
    """The most GPUs of `model` the team could ever hold: the tightest guaranteed + borrowing limit among its own
    and its org's entries for that model (or '*'). None: no cap."""
    caps = [e["guaranteed"] + e["borrowing_limit"] for e in entries
            if e["gpu_model"] in (model, "*") and e["borrowing_limit"] is not None]
    return min(caps) if caps else None


def admit(cmd: Submission, *, team: Mapping[str, Any] | None, priority_class: Mapping[str, Any] | None,
          quota_entries: Iterable[Mapping[str, Any]]) -> dict[str, Any] | Refusal:
    """Admitted (the job's priority class, resolved: name, value, preemptible) or why not."""
    if team is None:
        return Refusal(422, "UnknownTeam", f"team {cmd.team!r} does not exist", {"team": cmd.team})
    if priority_class is None:
        return Refusal(422, "UnknownPriorityClass", f"priority class {cmd.priority_class!r} does not exist",
                       {"priority_class": cmd.priority_class})
    entries = list(quota_entries)
    models = list(cmd.gpu_models) or ["*"]
    what = ", ".join(models) if cmd.gpu_models else "any model"
    caps = [ceiling(entries, m) for m in models]
    if all(c is not None for c in caps):
        best = max(c for c in caps if c is not None)
        if cmd.gpus > best:
            return Refusal(
                422, "ExceedsTeamCapacity",
                f"team {cmd.team!r} can never hold {cmd.gpus} GPU(s) of {what}: its quota allows at "
                f"most {best:g}", {"team": cmd.team, "requested": cmd.gpus, "ceiling": best})
    return {"admitted": True, "priority_class": priority_class["name"], "priority": priority_class["value"],
            "preemptible": priority_class["preemptible"]}


def approval_reasons(cmd: Submission, rules: Iterable[Mapping[str, Any]]) -> list[str]:
    """Which enabled rules send this submission to a person first (empty: none)."""
    reasons = []
    for r in rules:
        if not r["enabled"]:
            continue
        if r["rule"] == "gpus_over" and cmd.gpus > float(r["value"]):
            reasons.append(f"more than {r['value']} GPUs")
        elif r["rule"] == "runtime_over_s" and (cmd.max_runtime_s is None or cmd.max_runtime_s > float(r["value"])):
            reasons.append(f"runtime above {r['value']} s (or undeclared)")
        elif r["rule"] == "priority_class" and cmd.priority_class == r["value"]:
            reasons.append(f"priority class {r['value']}")
    return reasons


# The most a numeric approval rule may say: more GPUs than any fleet, or a runtime beyond 30 years, is a typo.
RULE_LIMITS = {"gpus_over": 1_000_000.0, "runtime_over_s": 1e9}
_NAME = re.compile(NAME_PATTERN)


def rule_value_error(rule: str, value: str) -> str | None:
    """Why `value` cannot be this rule's threshold (None: it can). Numeric rules take a finite number from 0 to
    their limit (`float()` alone would take "-5", "nan" and "inf"); `priority_class` takes a class name."""
    if rule == "priority_class":
        return None if _NAME.fullmatch(value) else f"priority_class needs a priority class name, got {value!r}"
    try:
        number = float(value)
    except ValueError:
        return f"{rule} needs a number, got {value!r}"
    if not math.isfinite(number) or not 0 <= number <= RULE_LIMITS[rule]:
        return f"{rule} needs a number from 0 to {RULE_LIMITS[rule]:g}, got {value!r}"
    return None


def quota_path_error(path: str, *, org_known: bool, team: Mapping[str, Any] | None) -> Refusal | None:
    """A quota entry may be set only where the tree exists: its org, and its team in that org (projects are made
    by the jobs that name them). None: the path is fine."""
    parts = path.split("/")
    if not org_known:
        return Refusal(422, "UnknownOrg", f"org {parts[0]!r} does not exist: create a team in it first",
                       {"org": parts[0]})
    if len(parts) > 1 and (team is None or team["org"] != parts[0]):
        return Refusal(422, "UnknownTeam", f"no team {parts[1]!r} in org {parts[0]!r}", {"team": parts[1]})
    return None


def team_exists_refusal(team: str, org: str, existing: Mapping[str, Any]) -> Refusal | None:
    """Creating a team that exists: fine in the same org (nothing is created), a conflict in another one."""
    if existing["org"] != org:
        return Refusal(409, "TeamExists", f"team {team!r} exists in org {existing['org']!r}", {"team": team})
    return None


def quota_limits_refusal(guaranteed: float, lending_limit: float | None) -> Refusal | None:
    """A level can lend only what it is guaranteed."""
    if lending_limit is not None and lending_limit > guaranteed:
        return Refusal(422, "InvalidQuota", "a lending limit cannot exceed what is guaranteed")
    return None


def decision_refusal(approval_id: str, request: Mapping[str, Any] | None, approve: bool,
                     now: datetime) -> Refusal | None:
    """Deciding an approval request as stored (`request`; None: there is none): only a pending one, and a loan
    cannot be granted once its end has passed (checked before the decision is written, so nothing is half done)."""
    if request is None:
        return Refusal(404, "ApprovalNotFound", f"no approval request {approval_id}")
    if request["state"] != "pending":
        return Refusal(409, "AlreadyDecided", f"approval {approval_id} was already {request['state']}")
    if request["kind"] == "loan" and approve and request["loan_until"] <= now:
        return Refusal(409, "LoanExpired", "the loan would already be over; ask again")
    return None


def loan_refusal(path: str, until: datetime, now: datetime, max_days: int) -> Refusal | None:
    """A quota loan is for a team or a project, and ends in the future, at most `max_days` ahead."""
    if len(path.split("/")) < 2:
        return Refusal(422, "InvalidLoan", "a loan is for a team or a project (org/team[/project])")
    if not now < until <= now + timedelta(days=max_days):
        return Refusal(422, "InvalidLoan", f"until must be in the future and at most {max_days} days ahead")
    return None


def loan_team_refusal(path: str, team: Mapping[str, Any] | None) -> Refusal | None:
    """The loan's team must exist in the loan's org."""
    org, name = path.split("/")[:2]
    if team is None or team["org"] != org:
        return Refusal(422, "UnknownTeam", f"no team {name} in org {org}", {"team": name})
    return None
