"""Admission rules applied at submit time. Each refusal carries a machine reason and a human message."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from libs.contracts.commands import AdmitJob, Reply


def ceiling(entries: Iterable[Mapping[str, Any]], model: str) -> float | None:
    """The most GPUs of `model` the team could ever hold: the tightest guaranteed + borrowing limit among its own
    and its org's entries for that model (or '*'). None: no cap."""
    caps = [e["guaranteed"] + e["borrowing_limit"] for e in entries
            if e["gpu_model"] in (model, "*") and e["borrowing_limit"] is not None]
    return min(caps) if caps else None


def admit(cmd: AdmitJob, *, team: Mapping[str, Any] | None, priority_class: Mapping[str, Any] | None,
          quota_entries: Iterable[Mapping[str, Any]]) -> Reply:
    if team is None:
        return Reply.failure(422, "UnknownTeam", f"team {cmd.team!r} does not exist", team=cmd.team)
    if priority_class is None:
        return Reply.failure(422, "UnknownPriorityClass", f"priority class {cmd.priority_class!r} does not exist",
                             priority_class=cmd.priority_class)
    entries = list(quota_entries)
    models = cmd.gpu_models or ["*"]
    caps = [ceiling(entries, m) for m in models]
    if all(c is not None for c in caps):
        best = max(c for c in caps if c is not None)
        if cmd.gpus > best:
            return Reply.failure(
                422, "ExceedsTeamCapacity",
                f"team {cmd.team!r} can never hold {cmd.gpus} GPU(s) of {', '.join(models)}: its quota allows at "
                f"most {best:g}", team=cmd.team, requested=cmd.gpus, ceiling=best)
    return Reply.success({"admitted": True, "priority_class": priority_class["name"],
                          "priority": priority_class["value"], "preemptible": priority_class["preemptible"]})


def approval_reasons(cmd: AdmitJob, rules: Iterable[Mapping[str, Any]]) -> list[str]:
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
