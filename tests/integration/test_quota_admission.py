"""Quota admission against real NATS and PostgreSQL, through the service's request/reply subject: what it reads in
one round trip (team, priority class, the team's and its org's effective entries, approval rules) decides as the
rules say — unknown team or class, the tightest ceiling of team and org, a loan raising it, approval rules."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import timedelta

import pytest

from libs.bus.rpc import request
from libs.contracts import subjects
from libs.contracts.commands import (
    AdmitJob,
    Command,
    CreateTeam,
    DecideApproval,
    Reply,
    RequestQuotaLoan,
    SetApprovalRule,
    SetQuota,
)
from libs.contracts.envelope import utcnow
from libs.runtime.service import ServiceRuntime
from services.quota.config import QuotaSettings
from services.quota.handlers import QuotaHandlers, routes

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("keep_test_logging_and_tracing")]


@pytest.fixture
async def quota(nats_url: str, pg_database: str, clean_jetstream: None) -> AsyncIterator[ServiceRuntime]:
    settings = QuotaSettings(nats_url=nats_url, database_url=pg_database, http_port=0, log_level="WARNING",
                             instance="quota-test")
    rt = ServiceRuntime("quota", settings, migrations_package="services.quota")
    await rt.start()
    await rt.mount(routes(QuotaHandlers(rt)))
    try:
        yield rt
    finally:
        await rt.shutdown()


async def ask(rt: ServiceRuntime, subject: str, cmd: Command) -> Reply:
    return await request(rt.nc, subject, cmd, timeout=10)


def job(team: str = "ml", gpus: int = 1, **kw: object) -> AdmitJob:
    return AdmitJob(team=team, project="default", priority_class=kw.pop("priority_class", "normal"),  # type: ignore[arg-type]
                    gpus=gpus, gpu_models=kw.pop("gpu_models", ["H100-80GB"]), **kw)  # type: ignore[arg-type]


async def test_admission_refuses_unknown_teams_and_classes_and_admits_with_the_class_priority(
        quota: ServiceRuntime) -> None:
    assert (await ask(quota, subjects.CMD_QUOTA_CREATE_TEAM, CreateTeam(team="ml", org="acme"))).ok
    unknown_team = await ask(quota, subjects.CMD_QUOTA_ADMIT, job(team="nobody"))
    assert unknown_team.error is not None and unknown_team.error.reason == "UnknownTeam"
    unknown_class = await ask(quota, subjects.CMD_QUOTA_ADMIT, job(priority_class="platinum"))
    assert unknown_class.error is not None and unknown_class.error.reason == "UnknownPriorityClass"
    admitted = await ask(quota, subjects.CMD_QUOTA_ADMIT, job(gpus=64))  # no quota entry: no ceiling
    assert admitted.ok and admitted.result["priority_class"] == "normal"
    assert isinstance(admitted.result["priority"], int) and "approval_required" not in admitted.result


async def test_the_tightest_of_team_and_org_ceilings_applies_and_a_loan_raises_it(quota: ServiceRuntime) -> None:
    await ask(quota, subjects.CMD_QUOTA_CREATE_TEAM, CreateTeam(team="ml", org="acme"))
    await ask(quota, subjects.CMD_QUOTA_CREATE_TEAM, CreateTeam(team="other", org="acme"))
    await ask(quota, subjects.CMD_QUOTA_SET_QUOTA, SetQuota(path="acme/ml", gpu_model="H100-80GB", guaranteed=4,
                                                             borrowing_limit=2))
    await ask(quota, subjects.CMD_QUOTA_SET_QUOTA, SetQuota(path="acme", gpu_model="*", guaranteed=5,
                                                             borrowing_limit=0))
    assert (await ask(quota, subjects.CMD_QUOTA_ADMIT, job(gpus=5))).ok
    over = await ask(quota, subjects.CMD_QUOTA_ADMIT, job(gpus=6))  # team allows 6, the org only 5
    assert over.error is not None and over.error.reason == "ExceedsTeamCapacity" and "at most 5" in over.error.message
    # another team of the same org is held to the org's entry only
    assert not (await ask(quota, subjects.CMD_QUOTA_ADMIT, job(team="other", gpus=6))).ok
    assert (await ask(quota, subjects.CMD_QUOTA_ADMIT, job(team="other", gpus=5))).ok
    # an approved loan raises the team entry's effective guarantee (4 + 3 + borrowing 2 = 9); with room in the
    # org, that is the ceiling
    await ask(quota, subjects.CMD_QUOTA_SET_QUOTA, SetQuota(path="acme", gpu_model="*", guaranteed=20,
                                                             borrowing_limit=0))
    assert not (await ask(quota, subjects.CMD_QUOTA_ADMIT, job(gpus=7))).ok
    loan = await ask(quota, subjects.CMD_QUOTA_REQUEST_LOAN, RequestQuotaLoan(
        path="acme/ml", gpu_model="H100-80GB", gpus=3, until=utcnow() + timedelta(days=1), reason="deadline",
        requested_by="alice"))
    assert loan.ok, loan.error
    decided = await ask(quota, subjects.CMD_QUOTA_DECIDE_APPROVAL, DecideApproval(
        approval_id=loan.result["approval_id"], approve=True, comment="", decided_by="root"))
    assert decided.ok, decided.error
    assert (await ask(quota, subjects.CMD_QUOTA_ADMIT, job(gpus=9))).ok
    assert not (await ask(quota, subjects.CMD_QUOTA_ADMIT, job(gpus=10))).ok


async def test_enabled_approval_rules_send_a_submission_to_a_person_and_disabled_ones_do_not(
        quota: ServiceRuntime) -> None:
    await ask(quota, subjects.CMD_QUOTA_CREATE_TEAM, CreateTeam(team="ml"))
    await ask(quota, subjects.CMD_QUOTA_SET_APPROVAL_RULE, SetApprovalRule(rule="gpus_over", value="4"))
    await ask(quota, subjects.CMD_QUOTA_SET_APPROVAL_RULE, SetApprovalRule(rule="runtime_over_s", value="3600",
                                                                          enabled=False))
    small = await ask(quota, subjects.CMD_QUOTA_ADMIT, job(gpus=2, job_id="j-small"))
    assert small.ok and "approval_required" not in small.result
    big = await ask(quota, subjects.CMD_QUOTA_ADMIT, job(gpus=8, job_id="j-big"))
    assert big.ok and big.result["approval_required"] is True
    assert big.result["approval_reasons"] == ["more than 4 GPUs"]
    again = await ask(quota, subjects.CMD_QUOTA_ADMIT, job(gpus=8, job_id="j-big"))  # a retried submission
    assert again.result["approval_id"] == big.result["approval_id"]
