"""Admission rules applied at submit time. Each refusal carries a machine reason and a human message."""

from __future__ import annotations

from libs.contracts.commands import PRIORITY_CLASSES, AdmitJob, Reply


def admit(cmd: AdmitJob, *, team_exists: bool, limits: dict[str, int | None]) -> Reply:
    """`limits` maps GPU model ('*' for any) to the most GPUs the team could ever hold (guaranteed + borrowing);
    None means unlimited. No quota rows means the team is not capped yet."""
    if not team_exists:
        return Reply.failure(422, "UnknownTeam", f"team {cmd.team!r} does not exist", team=cmd.team)
    if cmd.priority_class not in PRIORITY_CLASSES:
        return Reply.failure(422, "UnknownPriorityClass", f"priority class {cmd.priority_class!r} does not exist")
    if limits:
        models = cmd.gpu_models or ["*"]
        ceilings = [limits.get(m, limits.get("*", 0)) for m in models]
        if all(c is not None for c in ceilings) and cmd.gpus > max(c for c in ceilings if c is not None):
            return Reply.failure(
                422, "ExceedsTeamCapacity",
                f"team {cmd.team!r} can never hold {cmd.gpus} GPU(s) of {', '.join(models)}: its quota allows at "
                f"most {max(c for c in ceilings if c is not None)}",
                team=cmd.team, requested=cmd.gpus)
    return Reply.success({"admitted": True})
