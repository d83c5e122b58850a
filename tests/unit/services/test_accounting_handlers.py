"""Accounting's handlers on the fake runtime (libs/runtime/fake.py): a job's queue wait, an allocation's GPU rows and
its one ledger row and UsageRecorded, prices, through the routing table; the SQL (interval arithmetic, rollups,
reports) is tested against PostgreSQL in tests/integration/test_accounting*.py."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from libs.contracts import subjects
from libs.contracts.events import (
    AllocatedGpu,
    AllocationGranted,
    AllocationReleased,
    JobSubmitted,
    UsageRecorded,
)
from libs.contracts.reports import SetCostRate
from libs.runtime.fake import FakeRuntime, FakeStore
from services.accounting import handlers, store
from services.accounting.config import AccountingSettings
from services.accounting.handlers import AccountingHandlers, AllocationBusy, routes

NOW = datetime(2026, 1, 1, 12, tzinfo=UTC)


class FakeAccountingStore(FakeStore):
    """The accounting store functions these handlers call, on dicts (as services.accounting.store)."""

    def __init__(self) -> None:
        super().__init__(store)
        self.jobs: dict[str, dict[str, Any]] = {}
        self.waits: list[dict[str, Any]] = []
        self.intervals: dict[str, dict[str, Any]] = {}  # allocation id -> its rows, in short
        self.ledger: dict[str, dict[str, Any]] = {}
        self.rates: dict[tuple[str, str, datetime], dict[str, Any]] = {}
        self.busy: set[str] = set()  # allocations another transaction holds

    async def job_submitted(self, conn: Any, data: JobSubmitted, user: str, *, entered_at: datetime,
                            demand_milli: int, gpu_model: str) -> None:
        self.jobs[data.job_id] = {"user": user, "kind": data.kind}
        if not any(w["job_id"] == data.job_id and w["ended_at"] is None for w in self.waits):
            self.waits.append({"job_id": data.job_id, "entered_at": entered_at, "demand_milli": demand_milli,
                               "ended_at": None, "outcome": None})

    async def close_wait(self, conn: Any, job_id: str, at: datetime, outcome: str, gpu_model: str | None = None) \
            -> None:
        for w in self.waits:
            if w["job_id"] == job_id and w["ended_at"] is None:
                w.update(ended_at=max(at, w["entered_at"]), outcome=outcome)

    async def lock_allocation(self, conn: Any, data: Any) -> dict[str, Any]:
        job = self.jobs.get(data.job_id, {})
        interval = self.intervals.get(data.allocation_id)
        return {"locked": data.allocation_id not in self.busy, "user_name": job.get("user") or "unknown",
                "job_kind": job.get("kind") or "unknown", "interval_kind": interval["kind"] if interval else None}

    async def insert_intervals(self, conn: Any, data: Any, *, user: str, kind: str, granted_at: datetime,
                               released_at: datetime | None, reason: str | None, idle_util_pct: float,
                               wait_granted: str | None = None) -> bool:
        if wait_granted is not None:
            await self.close_wait(conn, data.job_id, granted_at, "granted", wait_granted)
        if data.allocation_id in self.intervals:
            return False
        self.intervals[data.allocation_id] = {"gpus": len(data.gpus), "kind": kind, "granted_at": granted_at,
                                              "released_at": released_at, "reason": reason}
        return True

    async def close_intervals(self, conn: Any, allocation_id: str, released_at: datetime, reason: str,
                              idle_util_pct: float) -> int:
        rows = self.intervals.get(allocation_id)
        if rows is None or rows["released_at"] is not None:
            return 0
        rows.update(released_at=max(released_at, rows["granted_at"]), reason=reason)
        return rows["gpus"]

    async def record_usage(self, conn: Any, data: AllocationReleased, *, model: str, user: str, kind: str,
                           share_milli: int, milli_us: int) -> bool:
        if data.allocation_id in self.ledger:  # ON CONFLICT (allocation_id) DO NOTHING
            return False
        self.ledger[data.allocation_id] = {"model": model, "user": user, "kind": kind, "milli_us": milli_us}
        return True

    async def get_rate(self, conn: Any, gpu_model: str, mig_profile: str, effective_from: datetime) \
            -> dict[str, Any] | None:
        return self.rates.get((gpu_model, mig_profile, effective_from))


@pytest.fixture
async def accounting(monkeypatch: pytest.MonkeyPatch) -> tuple[FakeRuntime, FakeAccountingStore]:
    fake = FakeAccountingStore()
    monkeypatch.setattr(handlers, "store", fake)
    rt = FakeRuntime("accounting", stores=(fake,))
    await rt.mount(routes(AccountingHandlers(rt, AccountingSettings())))  # type: ignore[arg-type]
    return rt, fake


def submitted(job_id: str = "j1") -> JobSubmitted:
    return JobSubmitted(job_id=job_id, name="demo", team="research", project="default", kind="training",
                        priority_class="normal", priority=100, gpus=2, submitted_at=NOW, submitted_by="alice")


def allocation(event: type, **over: Any) -> Any:
    doc = {"allocation_id": "a1", "job_id": "j1", "team": "research", "project": "default", "cluster": "c1",
           "node": "n1", "granted_at": NOW + timedelta(seconds=30),
           "gpus": [AllocatedGpu(uuid=f"GPU-{i}", index=i, model="H100-80GB") for i in range(2)]}
    return event(**(doc | over))


def released(**over: Any) -> AllocationReleased:
    return allocation(AllocationReleased, released_at=NOW + timedelta(seconds=130), reason="JobCompleted", **over)


async def test_a_job_waits_until_granted_and_its_release_writes_one_ledger_row(accounting) -> None:  # type: ignore[no-untyped-def]
    rt, fake = accounting
    await rt.deliver(submitted())
    assert [(w["job_id"], w["demand_milli"], w["outcome"]) for w in fake.waits] == [("j1", 2000, None)]
    await rt.deliver(allocation(AllocationGranted, kind="training"))
    assert fake.waits[0]["outcome"] == "granted" and fake.intervals["a1"]["released_at"] is None

    await rt.deliver(released())
    [usage] = rt.emitted(UsageRecorded)
    assert (usage.allocation_id, usage.user, usage.kind, usage.gpu_count) == ("a1", "alice", "training", 2)
    assert usage.gpu_seconds == pytest.approx(200.0)  # 100 s on 2 whole GPUs
    assert fake.ledger["a1"]["milli_us"] == 100 * 1_000_000 * 2000
    assert fake.intervals["a1"]["reason"] == "JobCompleted"


async def test_a_release_delivered_twice_or_announced_twice_is_charged_once(accounting) -> None:  # type: ignore[no-untyped-def]
    rt, fake = accounting
    await rt.deliver(allocation(AllocationGranted))
    event = await rt.deliver(released())
    row = fake.ledger.pop("a1")  # were the handler to run again, it would write the row and charge again
    await rt.deliver(released(), event=event)  # the same event: the inbox holds it
    assert fake.ledger == {} and len(rt.emitted(UsageRecorded)) == 1
    fake.ledger["a1"] = row
    await rt.deliver(released())  # another event of the same release: the ledger row exists
    assert len(rt.emitted(UsageRecorded)) == 1 and fake.ledger == {"a1": row}
    assert len(rt.inbox) == 3  # the grant and both releases were applied (the second one changed nothing)


async def test_a_release_of_a_grant_accounting_never_saw_is_charged_from_the_release(accounting) -> None:  # type: ignore[no-untyped-def]
    rt, fake = accounting
    await rt.deliver(released())
    [usage] = rt.emitted(UsageRecorded)
    assert usage.user == "unknown" and fake.intervals["a1"]["released_at"] == NOW + timedelta(seconds=130)


async def test_an_allocation_another_transaction_holds_is_retried_and_nothing_is_kept(accounting) -> None:  # type: ignore[no-untyped-def]
    rt, fake = accounting
    fake.busy.add("a1")
    with pytest.raises(AllocationBusy):
        await rt.deliver(allocation(AllocationGranted))
    assert fake.intervals == {} and rt.inbox == set() and rt.rollbacks == 1
    fake.busy.clear()
    await rt.deliver(allocation(AllocationGranted))  # the redelivery after the back-off applies it
    assert "a1" in fake.intervals


async def test_withdrawing_a_price_that_does_not_exist_is_refused_and_a_bad_one_never_reaches_it(accounting) -> None:  # type: ignore[no-untyped-def]
    rt, _ = accounting
    missing = await rt.request(subjects.CMD_ACCOUNTING_SET_COST_RATE,
                               SetCostRate(gpu_model="H100-80GB", effective_from=NOW, delete=True))
    assert missing.error is not None and (missing.error.status, missing.error.reason) == (404, "CostRateNotFound")
    negative = await rt.request(subjects.CMD_ACCOUNTING_SET_COST_RATE,
                                {"gpu_model": "H100-80GB", "effective_from": NOW.isoformat(), "price_per_hour": -1})
    assert negative.error is not None and negative.error.status == 400
    assert rt.outbox == []
