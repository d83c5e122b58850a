"""The quota service's checks on what an admin sets: approval-rule thresholds and where a quota entry may go."""

from __future__ import annotations

import pytest

from services.quota.domain import quota_path_error, rule_value_error


@pytest.mark.parametrize("rule, value", [("gpus_over", "8"), ("gpus_over", "0"), ("gpus_over", "0.5"),
                                         ("runtime_over_s", "86400"), ("priority_class", "production-inference")])
def test_sane_thresholds_are_taken(rule: str, value: str) -> None:
    assert rule_value_error(rule, value) is None


@pytest.mark.parametrize("rule, value", [("gpus_over", "-5"), ("gpus_over", "nan"), ("gpus_over", "inf"),
                                         ("runtime_over_s", "-inf"), ("gpus_over", "1e308"), ("gpus_over", "many"),
                                         ("runtime_over_s", "2e9"), ("priority_class", "Not A Class!")])
def test_negative_infinite_or_absurd_thresholds_are_refused(rule: str, value: str) -> None:
    """`float()` alone took "-5", "nan" and "inf" (a rule no job could ever trip, or every job)."""
    assert rule in (rule_value_error(rule, value) or "")


def test_a_quota_entry_goes_only_where_the_tree_exists() -> None:
    research = {"team": "research", "org": "default"}
    assert quota_path_error("default", org_known=True, team=None) is None
    assert quota_path_error("default/research", org_known=True, team=research) is None
    assert quota_path_error("default/research/any-project", org_known=True, team=research) is None
    assert quota_path_error("acme", org_known=False, team=None).reason == "UnknownOrg"
    assert quota_path_error("default/ghost", org_known=True, team=None).reason == "UnknownTeam"
    moved = quota_path_error("acme/research", org_known=True, team=research)  # the team is in another org
    assert moved.reason == "UnknownTeam" and moved.details == {"team": "research"}


def test_a_request_beyond_the_teams_ceiling_names_the_models_it_may_use() -> None:
    from libs.contracts.commands import AdmitJob
    from services.quota.domain import Refusal, admit

    entry = {"gpu_model": "*", "guaranteed": 4.0, "borrowing_limit": 2.0}
    args = {"team": {"team": "ml"}, "priority_class": {"name": "normal", "value": 0, "preemptible": True},
            "quota_entries": [entry]}
    anything = admit(AdmitJob(team="ml", project="p", priority_class="normal", gpus=8), **args)
    assert isinstance(anything, Refusal) and anything.reason == "ExceedsTeamCapacity"
    assert "can never hold 8 GPU(s) of any model: its quota allows at most 6" in anything.message
    pinned = admit(AdmitJob(team="ml", project="p", priority_class="normal", gpus=8, gpu_models=["H100"]), **args)
    assert isinstance(pinned, Refusal) and "8 GPU(s) of H100:" in pinned.message
    fits = admit(AdmitJob(team="ml", project="p", priority_class="normal", gpus=6), **args)
    assert fits == {"admitted": True, "priority_class": "normal", "priority": 0, "preemptible": True}


def test_decisions_team_and_loan_rules_name_their_refusal() -> None:
    from datetime import UTC, datetime, timedelta

    from services.quota.domain import (
        decision_refusal,
        loan_refusal,
        loan_team_refusal,
        quota_limits_refusal,
        team_exists_refusal,
    )

    now = datetime(2026, 6, 1, tzinfo=UTC)
    assert team_exists_refusal("ml", "default", {"org": "default"}) is None
    assert team_exists_refusal("ml", "default", {"org": "labs"}).reason == "TeamExists"
    assert quota_limits_refusal(4, 4) is None and quota_limits_refusal(4, None) is None
    assert quota_limits_refusal(4, 5).reason == "InvalidQuota"
    pending = {"state": "pending", "kind": "loan", "loan_until": now + timedelta(hours=1)}
    assert decision_refusal("a", pending, True, now) is None
    assert decision_refusal("a", None, True, now).status == 404
    assert decision_refusal("a", {**pending, "state": "denied"}, True, now).reason == "AlreadyDecided"
    assert decision_refusal("a", {**pending, "loan_until": now}, True, now).reason == "LoanExpired"
    assert decision_refusal("a", {**pending, "loan_until": now}, False, now) is None  # a late loan may be denied
    assert decision_refusal("a", {**pending, "kind": "job", "loan_until": None}, True, now) is None
    assert loan_refusal("default", now + timedelta(days=1), now, 90).reason == "InvalidLoan"
    assert loan_refusal("default/ml", now, now, 90).reason == "InvalidLoan"
    assert loan_refusal("default/ml", now + timedelta(days=91), now, 90).reason == "InvalidLoan"
    assert loan_refusal("default/ml/p", now + timedelta(days=90), now, 90) is None
    assert loan_team_refusal("default/ml", {"org": "default"}) is None
    assert loan_team_refusal("default/ml", None).reason == "UnknownTeam"
    assert loan_team_refusal("labs/ml", {"org": "default"}).reason == "UnknownTeam"
