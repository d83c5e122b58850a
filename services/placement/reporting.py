"""Placement's /metrics from what a cycle read and decided: allocations by state, GPUs held per model and team
against guarantees, the core's time per phase, and what is left pending by reason."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Any

from libs.core import Plan
from libs.observability.metrics import (
    ALLOCATIONS,
    GPUS_ALLOCATED,
    PENDING_UNITS,
    QUOTA_GUARANTEED_GPUS,
    QUOTA_USED_GPUS,
    SCHEDULING_DECISIONS,
    SCHEDULING_PHASE_SECONDS,
)


def report_holdings(held: Any, quotas: Iterable[Any], teams: Iterable[Any]) -> None:
    """/metrics: live allocations by state, GPUs held per model, and per team what it holds against what it is
    guaranteed (shares counted by their share). `held`: the live allocations' tally (`incremental.LiveTally`)."""
    for state in ("running", "preempting"):
        ALLOCATIONS.labels(state=state).set(held.states[state])
    GPUS_ALLOCATED.clear()
    for model, milli in held.by_model.items():
        GPUS_ALLOCATED.labels(gpu_model=model).set(milli / 1000)
    QUOTA_USED_GPUS.clear()
    for (team, model), milli in held.by_team.items():
        QUOTA_USED_GPUS.labels(team=team, gpu_model=model).set(milli / 1000)
    org_of = {t["team"]: t["org"] for t in teams}
    QUOTA_GUARANTEED_GPUS.clear()
    for q in quotas:
        org, _, team = q["path"].partition("/")
        if team and "/" not in team and org_of.get(team, org) == org:
            QUOTA_GUARANTEED_GPUS.labels(team=team, gpu_model=q["gpu_model"]).set(q["guaranteed"])


def report_plan(plan: Plan) -> None:
    """/metrics: the core's time per phase, victims chosen, and what is left pending by reason."""
    for key, value in plan.stats:
        if key.endswith("_us"):
            SCHEDULING_PHASE_SECONDS.labels(phase=key[:-3]).observe(value / 1e6)
    if plan.preemptions:
        SCHEDULING_DECISIONS.labels(outcome="preempted").inc(len(plan.preemptions))
    PENDING_UNITS.clear()
    for reason, n in Counter(r.reason for r in plan.pending).items():
        PENDING_UNITS.labels(reason=reason).set(n)
