"""Quota's handlers on the fake runtime (libs/runtime/fake.py): teams, admission with approvals, decisions, and the
withdrawal of a cancelled job's request, through the routing table; the SQL itself is tested against PostgreSQL in
tests/integration/test_quota*.py."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from libs.contracts import subjects
from libs.contracts.commands import AdmitJob, CreateTeam, DecideApproval
from libs.contracts.events import (
    ApprovalDecided,
    ApprovalRequested,
    ApprovalWithdrawn,
    JobCancelled,
    TeamCreated,
)
from libs.runtime.fake import FakeRuntime, FakeStore
from services.quota import handlers, store
from services.quota.handlers import QuotaHandlers, routes

NOW = datetime(2026, 1, 1, 12, tzinfo=UTC)


class FakeQuotaStore(FakeStore):
    """The quota store functions these handlers call, on dicts (same names and arguments as services.quota.store)."""

    def __init__(self) -> None:
        super().__init__(store)
        self.teams: dict[str, dict[str, Any]] = {}
        self.classes = {"normal": {"name": "normal", "value": 100, "preemptible": False}}
        self.entries: list[dict[str, Any]] = []  # (path, gpu_model, guaranteed, borrowing_limit)
        self.rules: list[dict[str, Any]] = []
        self.approvals: dict[str, dict[str, Any]] = {}

    async def ensure_team(self, conn: Any, team: str, org: str = "default") -> dict[str, Any] | None:
        if team in self.teams:
            return None
        self.teams[team] = {"team": team, "org": org, "revision": len(self.teams) + 1, "created_at": NOW}
        return dict(self.teams[team])

    async def get_team(self, conn: Any, team: str) -> dict[str, Any] | None:
        return dict(self.teams[team]) if team in self.teams else None

    async def admission_inputs(self, conn: Any, team: str, priority_class: str) -> dict[str, Any]:
        row = self.teams.get(team)
        paths = {f"{row['org']}/{team}", row["org"]} if row else set()
        return {"team": {"team": team, "org": row["org"]} if row else None,
                "priority_class": self.classes.get(priority_class),
                "entries": [{k: e[k] for k in ("gpu_model", "guaranteed", "borrowing_limit")}
                            for e in self.entries if e["path"] in paths],
                "rules": list(self.rules)}

    async def insert_approval(self, conn: Any, **row: Any) -> dict[str, Any]:
        for existing in self.approvals.values():  # ON CONFLICT (job_id): the same request again
            if existing["job_id"] == row["job_id"]:
                return existing | {"inserted": False}
        doc = {**{k: row[k] for k in ("approval_id", "job_id", "job_name", "team", "project", "gpus",
                                      "priority_class", "reasons", "requested_by")},
               "state": "pending", "comment": "", "decided_by": None, "created_at": NOW, "decided_at": None,
               "kind": "job", "loan_path": None, "loan_gpu_model": None, "loan_until": None}
        self.approvals[row["approval_id"]] = doc
        return doc | {"inserted": True}

    async def decide_approval(self, conn: Any, approval_id: str, approved: bool, comment: str,
                              decided_by: str) -> dict[str, Any] | None:
        row = self.approvals.get(approval_id)
        if row is None or row["state"] != "pending":
            return None
        row.update(state="approved" if approved else "denied", comment=comment, decided_by=decided_by,
                   decided_at=NOW)
        return dict(row)

    async def get_approval(self, conn: Any, approval_id: str) -> dict[str, Any] | None:
        return dict(self.approvals[approval_id]) if approval_id in self.approvals else None

    async def withdraw_approval(self, conn: Any, job_id: str, reason: str) -> dict[str, Any] | None:
        for row in self.approvals.values():
            if row["job_id"] == job_id and row["state"] == "pending":
                row.update(state="withdrawn", comment=reason, decided_at=NOW)
                return dict(row)
        return None


@pytest.fixture
async def quota(monkeypatch: pytest.MonkeyPatch) -> tuple[FakeRuntime, FakeQuotaStore]:
    fake = FakeQuotaStore()
    monkeypatch.setattr(handlers, "store", fake)
    rt = FakeRuntime("quota", stores=(fake,))
    await rt.mount(routes(QuotaHandlers(rt)))  # type: ignore[arg-type]
    return rt, fake


def cancelled(job_id: str) -> JobCancelled:
    return JobCancelled(job_id=job_id, team="research", reason="wrong dataset", cancelled_at=NOW)


async def test_create_team_announces_a_new_team_once_and_refuses_it_in_another_org(quota) -> None:  # type: ignore[no-untyped-def]
    rt, fake = quota
    reply = await rt.request(subjects.CMD_QUOTA_CREATE_TEAM, CreateTeam(team="research", org="lab"))
    assert reply.ok and reply.result["created"] is True
    assert [(e.team, e.org) for e in rt.emitted(TeamCreated)] == [("research", "lab")]

    again = await rt.request(subjects.CMD_QUOTA_CREATE_TEAM, CreateTeam(team="research", org="lab"))
    assert again.ok and again.result["created"] is False
    elsewhere = await rt.request(subjects.CMD_QUOTA_CREATE_TEAM, CreateTeam(team="research", org="other"))
    assert not elsewhere.ok and elsewhere.error is not None
    assert (elsewhere.error.status, elsewhere.error.reason) == (409, "TeamExists")
    assert len(rt.emitted(TeamCreated)) == 1 and fake.teams["research"]["org"] == "lab"


async def test_a_team_name_that_is_not_a_name_is_refused_before_the_handler(quota) -> None:  # type: ignore[no-untyped-def]
    rt, fake = quota
    reply = await rt.request(subjects.CMD_QUOTA_CREATE_TEAM, {"team": "Not A Name!"})
    assert not reply.ok and reply.error is not None and reply.error.status == 400
    assert reply.error.reason == "InvalidRequest" and fake.teams == {} and rt.outbox == []


async def test_admission_refuses_an_unknown_team_and_a_job_beyond_its_quota(quota) -> None:  # type: ignore[no-untyped-def]
    rt, fake = quota
    ask = AdmitJob(team="research", project="default", priority_class="normal", gpus=4, job_id="j1")
    unknown = await rt.request(subjects.CMD_QUOTA_ADMIT, ask)
    assert unknown.error is not None and unknown.error.reason == "UnknownTeam"

    await fake.ensure_team(None, "research")
    fake.entries.append({"path": "default/research", "gpu_model": "*", "guaranteed": 2.0, "borrowing_limit": 0.0})
    beyond = await rt.request(subjects.CMD_QUOTA_ADMIT, ask)
    assert beyond.error is not None and (beyond.error.status, beyond.error.reason) == (422, "ExceedsTeamCapacity")
    fitting = await rt.request(subjects.CMD_QUOTA_ADMIT, ask.model_copy(update={"gpus": 2}))
    assert fitting.ok and fitting.result["priority"] == 100 and "approval_required" not in fitting.result
    assert fake.approvals == {} and rt.outbox == []


async def test_a_rule_holds_a_job_for_approval_once_and_a_decision_announces_it(quota) -> None:  # type: ignore[no-untyped-def]
    rt, fake = quota
    await fake.ensure_team(None, "research")
    fake.rules.append({"rule": "gpus_over", "value": "2", "enabled": True})
    ask = AdmitJob(team="research", project="default", priority_class="normal", gpus=4, job_id="j1", job_name="big")
    held = await rt.request(subjects.CMD_QUOTA_ADMIT, ask)
    assert held.ok and held.result["approval_required"] is True
    assert held.result["approval_reasons"] == ["more than 2 GPUs"]
    retried = await rt.request(subjects.CMD_QUOTA_ADMIT, ask)  # a retried submission finds the same request
    assert retried.result["approval_id"] == held.result["approval_id"]
    assert [e.job_id for e in rt.emitted(ApprovalRequested)] == ["j1"]

    decided = await rt.request(subjects.CMD_QUOTA_DECIDE_APPROVAL, DecideApproval(
        approval_id=held.result["approval_id"], approve=True, comment="ok", decided_by="admin"))
    assert decided.ok and decided.result["state"] == "approved"
    [event] = rt.emitted(ApprovalDecided)
    assert (event.job_id, event.approved, event.decided_by) == ("j1", True, "admin")
    twice = await rt.request(subjects.CMD_QUOTA_DECIDE_APPROVAL, DecideApproval(
        approval_id=held.result["approval_id"], approve=False))
    assert twice.error is not None and (twice.error.status, twice.error.reason) == (409, "AlreadyDecided")
    missing = await rt.request(subjects.CMD_QUOTA_DECIDE_APPROVAL, DecideApproval(approval_id="nope", approve=True))
    assert missing.error is not None and missing.error.reason == "ApprovalNotFound"
    assert len(rt.emitted(ApprovalDecided)) == 1


async def test_a_cancelled_job_withdraws_its_request_and_a_redelivery_is_applied_once(quota) -> None:  # type: ignore[no-untyped-def]
    rt, fake = quota
    await fake.ensure_team(None, "research")
    await fake.insert_approval(None, approval_id="a1", job_id="j1", job_name="big", team="research",
                               project="default", gpus=4, priority_class="normal", reasons=["x"], requested_by="u")
    event = await rt.deliver(cancelled("j1"))
    assert fake.approvals["a1"]["state"] == "withdrawn"
    [withdrawn] = rt.emitted(ApprovalWithdrawn)
    assert (withdrawn.approval_id, withdrawn.reason) == ("a1", "job cancelled: wrong dataset")
    assert ("quota", event.id) in rt.inbox

    fake.approvals["a1"]["state"] = "pending"  # were the handler to run again, it would withdraw it again
    await rt.deliver(cancelled("j1"), event=event)
    assert fake.approvals["a1"]["state"] == "pending" and len(rt.emitted(ApprovalWithdrawn)) == 1


async def test_a_failing_handler_rolls_back_its_state_events_and_inbox_row(quota, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    rt, fake = quota
    await fake.insert_approval(None, approval_id="a1", job_id="j1", job_name="big", team="research",
                               project="default", gpus=4, priority_class="normal", reasons=["x"], requested_by="u")

    def broken(**_: Any) -> ApprovalWithdrawn:
        raise RuntimeError("the event does not build")
    monkeypatch.setattr(handlers, "ApprovalWithdrawn", broken)
    with pytest.raises(RuntimeError):
        await rt.deliver(cancelled("j1"))
    assert fake.approvals["a1"]["state"] == "pending" and rt.outbox == [] and rt.inbox == set()
    assert rt.rollbacks == 1


async def test_an_expired_loan_is_refused_before_anything_is_decided(quota) -> None:  # type: ignore[no-untyped-def]
    rt, fake = quota
    fake.approvals["a1"] = {"approval_id": "a1", "job_id": None, "job_name": "quota loan for default/research",
                            "team": "research", "project": "default", "gpus": 2, "priority_class": "",
                            "reasons": ["loan"], "requested_by": "ana", "state": "pending", "comment": "",
                            "decided_by": None, "created_at": NOW, "decided_at": None, "kind": "loan",
                            "loan_path": "default/research", "loan_gpu_model": "H100",
                            "loan_until": NOW - timedelta(minutes=1)}
    refused = await rt.request(subjects.CMD_QUOTA_DECIDE_APPROVAL, DecideApproval(approval_id="a1", approve=True))
    assert refused.error is not None and (refused.error.status, refused.error.reason) == (409, "LoanExpired")
    # the refusal left the request as it was: still pending, so it can be denied, and nothing was announced
    assert fake.approvals["a1"]["state"] == "pending" and rt.outbox == []
    denied = await rt.request(subjects.CMD_QUOTA_DECIDE_APPROVAL, DecideApproval(approval_id="a1", approve=False))
    assert denied.ok and denied.result["state"] == "denied"
    assert [e.approved for e in rt.emitted(ApprovalDecided)] == [False]
