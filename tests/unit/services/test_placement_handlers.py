"""Placement's event and command handlers on the fake runtime (libs/runtime/fake.py): the read model's nodes and
wanted jobs, a finished job's release (at once, or a stop asked of the agent for work it runs), and reclamation's
release request, through the routing table. The scheduling cycle itself (one snapshot statement, the core, the
store's constraints as verifier) is covered by tests/unit/core and tests/integration/test_placement*.py."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from libs.contracts import subjects
from libs.contracts.commands import ReleaseAllocation
from libs.contracts.events import (
    AllocatedGpu,
    AllocationPreempting,
    AllocationReleased,
    JobCancelled,
    JobCompleted,
    JobSubmitted,
    NodeLost,
)
from libs.runtime.fake import FakeRuntime, FakeStore
from services.placement import handlers, store
from services.placement.config import PlacementSettings
from services.placement.handlers import PlacementHandlers, routes

NOW = datetime(2026, 1, 1, 12, tzinfo=UTC)


class FakePlacementStore(FakeStore):
    """The placement store functions these handlers call, on dicts (as services.placement.store)."""

    def __init__(self) -> None:
        super().__init__(store)
        self.schedulable: dict[tuple[str, str], bool] = {}
        self.pending: dict[str, dict[str, Any]] = {}
        self.finished: set[str] = set()
        self.allocations: dict[str, dict[str, Any]] = {}

    async def set_node_schedulable(self, conn: Any, cluster: str, node: str, schedulable: bool) -> None:
        self.schedulable[(cluster, node)] = schedulable

    async def add_pending(self, conn: Any, data: JobSubmitted, traceparent: str | None) -> bool:
        live = any(a["job_id"] == data.job_id and a["released_at"] is None for a in self.allocations.values())
        if data.job_id in self.finished or live:
            return False
        self.pending[data.job_id] = {"job_id": data.job_id, "gpus": data.gpus, "attempt": data.attempt,
                                     "satisfied": False, "replica_set": data.replica_set}
        return True

    def _live(self, job_id: str, replica: int | None, min_replica: int | None, allocation_id: str | None,
              with_work: bool | None) -> list[dict[str, Any]]:
        return [a for a in self.allocations.values()
                if a["job_id"] == job_id and a["released_at"] is None
                and (replica is None or a["replica"] == replica)
                and (min_replica is None or a["replica"] >= min_replica)
                and (allocation_id is None or a["allocation_id"] == allocation_id)
                and (with_work is None or a["work"] == with_work)]

    async def release(self, conn: Any, job_id: str, reason: str, at: datetime, *, replica: int | None = None,
                      min_replica: int | None = None, allocation_id: str | None = None, finished: bool = False,
                      with_work: bool | None = None, exit: str | None = None) -> list[tuple[dict, list]]:
        released = []
        for a in self._live(job_id, replica, min_replica, allocation_id, with_work):
            a.update(released_at=at, release_reason=reason)
            released.append((dict(a), list(a["gpus"])))
        if finished:
            self.finished.add(job_id)
            self.pending.pop(job_id, None)
        return released

    async def request_stop(self, conn: Any, job_id: str, reason: str, at: datetime, *, max_grace_s: float,
                           replica: int | None = None, min_replica: int | None = None,
                           allocation_id: str | None = None) -> list[tuple[dict, list]]:
        stopping = []
        for a in self._live(job_id, replica, min_replica, allocation_id, with_work=True):
            deadline = at + timedelta(seconds=min(30.0, max_grace_s))
            a.update(preempt_reason=reason, preempt_deadline=min(a["preempt_deadline"] or deadline, deadline))
            stopping.append((dict(a), list(a["gpus"])))
        return stopping

    async def release_or_stop(self, conn: Any, job_id: str, reason: str, at: datetime, *, max_grace_s: float,
                              replica: int | None = None, min_replica: int | None = None,
                              allocation_id: str | None = None, finished: bool = False) -> tuple[list, list]:
        which = {"replica": replica, "min_replica": min_replica, "allocation_id": allocation_id}
        stopping = await self.request_stop(conn, job_id, reason, at, max_grace_s=max_grace_s, **which)
        return await self.release(conn, job_id, reason, at, finished=finished, with_work=False, **which), stopping

    async def allocation(self, conn: Any, allocation_id: str) -> dict[str, Any] | None:
        a = self.allocations.get(allocation_id)
        if a is None:
            return None
        replica_set = self.pending.get(a["job_id"], {}).get("replica_set", False)
        return {k: a[k] for k in ("allocation_id", "job_id", "replica", "released_at")} | {"replica_set": replica_set}

    async def refresh_satisfied(self, conn: Any, job_id: str, *, after_release: bool = False) -> bool:
        job = self.pending.get(job_id)
        if job is None or (after_release and not job["replica_set"]):
            return False
        job["satisfied"] = len(self._live(job_id, None, None, None, None)) >= 1
        return bool(job["satisfied"])


@pytest.fixture
async def placement(monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    fake = FakePlacementStore()
    monkeypatch.setattr(handlers, "store", fake)
    rt = FakeRuntime("placement", stores=(fake,))
    h = PlacementHandlers(rt, PlacementSettings())  # type: ignore[arg-type]
    await rt.mount(routes(h))
    return rt, fake, h


def hold(fake: FakePlacementStore, allocation_id: str, job_id: str = "j1", *, work: bool = False,
         replica: int = 0) -> None:
    fake.allocations[allocation_id] = {
        "allocation_id": allocation_id, "job_id": job_id, "replica": replica, "team": "research",
        "project": "default", "cluster": "c1", "node": "n1", "granted_at": NOW, "released_at": None,
        "work": work, "preempt_deadline": None, "preempt_reason": None,
        "gpus": [AllocatedGpu(uuid=f"GPU-{allocation_id}", index=0, model="H100-80GB")]}


def submitted(job_id: str = "j1") -> JobSubmitted:
    return JobSubmitted(job_id=job_id, name="demo", team="research", project="default", kind="batch",
                        priority_class="normal", priority=100, gpus=1, submitted_at=NOW)


async def test_a_submitted_job_is_wanted_and_wakes_the_cycle_after_the_commit(placement) -> None:  # type: ignore[no-untyped-def]
    rt, fake, h = placement
    assert not h._kick.is_set()
    await rt.deliver(submitted())
    assert fake.pending["j1"]["satisfied"] is False and h._kick.is_set()
    await rt.deliver(NodeLost(cluster="c1", node="n1", last_seen_at=NOW, detected_at=NOW))
    assert fake.schedulable == {("c1", "n1"): False}
    assert rt.outbox == []  # the read model announces nothing


async def test_a_cancelled_job_releases_its_gpus_stops_its_work_and_is_never_wanted_again(placement) -> None:  # type: ignore[no-untyped-def]
    rt, fake, _ = placement
    await rt.deliver(submitted())
    hold(fake, "a1")
    hold(fake, "a2", work=True, replica=1)
    event = await rt.deliver(JobCancelled(job_id="j1", team="research", reason="typo", cancelled_at=NOW))
    released, stopping = rt.emitted(AllocationReleased), rt.emitted(AllocationPreempting)
    assert [(e.allocation_id, e.reason) for e in released] == [("a1", "JobCancelled")]
    assert [(e.allocation_id, e.reason) for e in stopping] == [("a2", "JobCancelled")]
    assert fake.allocations["a2"]["released_at"] is None  # its GPUs wait for the agent's report of the exit
    assert "j1" in fake.finished and "j1" not in fake.pending

    await rt.deliver(JobCancelled(job_id="j1", team="research", reason="typo", cancelled_at=NOW), event=event)
    assert len(rt.emitted()) == 2
    await rt.deliver(submitted())  # a late submission of a finished job is not wanted
    assert fake.pending == {}


async def test_reclamation_releases_a_live_allocation_once_and_an_unknown_one_is_refused(placement) -> None:  # type: ignore[no-untyped-def]
    rt, fake, _ = placement
    hold(fake, "a1")
    ask = ReleaseAllocation(allocation_id="a1", reason="IdleReclaimed")
    first = await rt.request(subjects.CMD_PLACEMENT_RELEASE_ALLOCATION, ask)
    again = await rt.request(subjects.CMD_PLACEMENT_RELEASE_ALLOCATION, ask)
    assert (first.result["released"], again.result["released"]) == (1, 0)
    [released] = rt.emitted(AllocationReleased)
    assert (released.allocation_id, released.reason) == ("a1", "IdleReclaimed")
    missing = await rt.request(subjects.CMD_PLACEMENT_RELEASE_ALLOCATION, ask.model_copy(update={"allocation_id": "x"}))
    assert missing.error is not None and (missing.error.status, missing.error.reason) == (404, "AllocationNotFound")
    bad = await rt.request(subjects.CMD_PLACEMENT_RELEASE_ALLOCATION, {"allocation_id": "a1", "reason": "not a code"})
    assert bad.error is not None and bad.error.status == 400 and len(rt.emitted()) == 1


async def test_a_finished_job_wakes_the_cycle_only_when_it_freed_gpus_now(placement) -> None:  # type: ignore[no-untyped-def]
    """A job whose work is asked to stop frees nothing yet: a cycle then would place nothing (with thousands
    waiting, a whole cycle for nothing); the agent's report of the exit wakes it. One holding GPUs without work
    frees them at once and wakes it."""
    rt, fake, h = placement
    hold(fake, "w1", "j-work", work=True)
    await rt.deliver(JobCompleted(job_id="j-work", team="research", completed_at=NOW))
    assert [e.allocation_id for e in rt.emitted(AllocationPreempting)] == ["w1"] and not h._kick.is_set()
    hold(fake, "p1", "j-plain")
    await rt.deliver(JobCompleted(job_id="j-plain", team="research", completed_at=NOW))
    assert [e.allocation_id for e in rt.emitted(AllocationReleased)] == ["p1"] and h._kick.is_set()
    h._kick.clear()
    await rt.deliver(JobCancelled(job_id="j-none", team="research", reason="typo", cancelled_at=NOW))
    assert h._kick.is_set()  # nothing held: it may have been waiting (a reservation for it goes)
