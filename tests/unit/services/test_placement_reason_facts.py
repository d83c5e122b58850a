"""A pending reason's facts as placement stores them for explain (`domain.facts_json`): the core's ReasonFacts in the
contract's shape (libs.contracts.reasons.PendingFacts), validated and bounded."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from libs.contracts.reasons import MAX_LISTED, PendingFacts
from libs.core import Gpu, JobRequest, Node, Policy, Snapshot, schedule, teams_quota
from libs.core.plan import QuotaFacts, ReasonFacts
from services.placement.domain import facts_json, pending_facts


def _node(name: str, n: int, schedulable: bool = True) -> Node:
    return Node(name, "c1", tuple(Gpu(f"{name}-g{i}", i, "L40S", 46068) for i in range(n)), schedulable=schedulable)


def test_a_quota_refusal_and_the_node_census_become_contract_facts_per_job():
    snap = Snapshot((_node("a", 4), _node("b", 4, schedulable=False)), frozenset(), (), ())
    jobs = [JobRequest("q", team="t", gpus=3, submitted_at=0.0), JobRequest("big#0", team="u", gpus=8, submitted_at=0.0)]
    plan = schedule(snap, jobs, Policy(quotas=teams_quota({"t": 2, "u": 8}, "L40S", borrowing_limit=0)), now=0.0)
    got = {j: json.loads(doc) for j, doc in pending_facts(plan.pending).items()}
    assert set(got) == {"q", "big"}  # per job, like its reason
    assert got["q"]["quota"] == {"path": "default/t", "gpu_model": "L40S", "rule": "borrowing_limit",
                                 "used_gpus": 0.0, "asked_gpus": 3.0, "limit_gpus": 2.0, "guaranteed_gpus": 2.0}
    assert got["big"]["cause"] == "never_node" and got["big"]["filtered"] == {"cordoned": 1}
    assert got["big"]["nodes_evaluated"] == 2
    PendingFacts.model_validate(got["big"])


def test_lists_are_cut_with_their_count_and_a_soft_hold_has_no_start():
    many = tuple((f"v{i}", "PreemptedByPriority") for i in range(100))
    doc = json.loads(facts_json(ReasonFacts(cause="no_room", victims=many, victim_nodes=("n",),
                                            reservation_nodes=("n1", "n2"), reservation_start=float("inf"))))
    assert len(doc["victims"]) == MAX_LISTED and doc["victim_count"] == 100
    assert doc["soft_hold"] is True and "reservation_start" not in doc
    timed = json.loads(facts_json(ReasonFacts(cause="gang", reservation_nodes=("n1",), reservation_start=1.79611e9,
                                              reservation_in_s=600.0)))
    assert timed["reservation_start"] == "2026-12-01T07:26:40Z" and timed["reservation_in_s"] == 600.0


def test_the_contract_refuses_unknown_filters_and_oversized_lists():
    with pytest.raises(ValidationError):
        PendingFacts(filtered={"weather": 1})
    with pytest.raises(ValidationError):
        PendingFacts(holders=[f"j{i}" for i in range(MAX_LISTED + 1)])
    with pytest.raises(ValidationError):
        PendingFacts(quota={"path": "a", "gpu_model": "*", "rule": "borrowing_limit", "used_gpus": -1,
                            "asked_gpus": 1, "limit_gpus": 1, "guaranteed_gpus": 1})
    assert QuotaFacts("a", "*", "lending")  # the core's side stays plain data
