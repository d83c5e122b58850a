"""Reclamation's handlers on the fake runtime (libs/runtime/fake.py): following allocations, abnormal reclaims (a lost
node, a drain) counted per job up to the restart limit, and the release asked of a served stand-in for placement
after the commit, through the routing table; the SQL is tested with PostgreSQL in tests/e2e/test_reclamation.py and
tests/integration/test_accounting_reclamation_deadlocks.py."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from libs.contracts import subjects
from libs.contracts.commands import ReleaseAllocation, Reply
from libs.contracts.events import (
    AllocatedGpu,
    AllocationGranted,
    AllocationReleased,
    NodeCordoned,
    NodeLost,
    ReclaimDecided,
)
from libs.runtime.fake import FakeRuntime, FakeStore
from services.reclamation import handlers, store
from services.reclamation.config import ReclamationSettings
from services.reclamation.handlers import ReclamationHandlers, routes

NOW = datetime(2026, 1, 1, 12, tzinfo=UTC)
RELEASED_BEFORE = {"early"}  # allocations the fake placement says it released before it was asked


class FakeReclamationStore(FakeStore):
    """The reclamation store functions these handlers call, on dicts (as services.reclamation.store)."""

    def __init__(self) -> None:
        super().__init__(store)
        self.trackers: dict[str, dict[str, Any]] = {}
        self.abnormal: dict[str, int] = {}

    async def track(self, conn: Any, data: AllocationGranted) -> None:
        self.trackers.setdefault(data.allocation_id, {
            "allocation_id": data.allocation_id, "job_id": data.job_id, "team": data.team, "cluster": data.cluster,
            "node": data.node, "gpu_uuids": [g.uuid for g in data.gpus], "granted_at": data.granted_at,
            "last_busy_at": data.granted_at, "last_sample_at": None, "mean_util_pct": None, "max_util_pct": None,
            "kind": data.kind, "priority_class": data.priority_class, "max_runtime_s": data.max_runtime_s,
            "warned_at": None, "reclaim_deadline": None, "reclaim_reason": None})

    async def untrack(self, conn: Any, allocation_id: str) -> None:
        self.trackers.pop(allocation_id, None)

    async def trackers_on_node(self, conn: Any, cluster: str, node: str) -> list[dict[str, Any]]:
        return [dict(t) for t in self.trackers.values() if (t["cluster"], t["node"]) == (cluster, node)]

    async def abnormal_count(self, conn: Any, job_id: str) -> int:
        return self.abnormal.get(job_id, 0)

    async def count_abnormal(self, conn: Any, job_id: str, at: datetime) -> int:
        self.abnormal[job_id] = self.abnormal.get(job_id, 0) + 1
        return self.abnormal[job_id]

    async def mark_reclaiming(self, conn: Any, allocation_id: str, reason: str) -> bool:
        tracker = self.trackers.get(allocation_id)
        if tracker is None or tracker["reclaim_reason"] is not None:
            return False
        tracker["reclaim_reason"] = reason
        return True

    async def reclaiming(self, conn: Any) -> list[dict[str, Any]]:
        return [{"allocation_id": t["allocation_id"], "reclaim_reason": t["reclaim_reason"]}
                for t in self.trackers.values() if t["reclaim_reason"] is not None]


@pytest.fixture
async def reclamation(monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    fake = FakeReclamationStore()
    monkeypatch.setattr(handlers, "store", fake)
    rt = FakeRuntime("reclamation", stores=(fake,))
    await rt.mount(routes(ReclamationHandlers(rt, ReclamationSettings(max_abnormal_restarts=1))))  # type: ignore[arg-type]
    released: list[ReleaseAllocation] = []

    async def placement_releases(cmd: ReleaseAllocation) -> Reply:
        released.append(cmd)
        if cmd.allocation_id in RELEASED_BEFORE:  # as placement answers for an allocation it released already
            return Reply.success({"allocation_id": cmd.allocation_id, "released": 0})
        return Reply.success({"allocation_id": cmd.allocation_id, "released": 1})
    await rt.serve(subjects.CMD_PLACEMENT_RELEASE_ALLOCATION, ReleaseAllocation, placement_releases)
    return rt, fake, released


def granted(allocation_id: str, job_id: str, node: str = "n1") -> AllocationGranted:
    return AllocationGranted(allocation_id=allocation_id, job_id=job_id, team="research", project="default",
                             cluster="c1", node=node, granted_at=NOW,
                             gpus=[AllocatedGpu(uuid=f"GPU-{allocation_id}", index=0, model="H100")])


def lost(node: str = "n1") -> NodeLost:
    return NodeLost(cluster="c1", node=node, last_seen_at=NOW, detected_at=NOW)


async def test_a_lost_node_reclaims_its_allocations_once_and_asks_placement_to_release(reclamation) -> None:  # type: ignore[no-untyped-def]
    rt, fake, released = reclamation
    await rt.deliver(granted("a1", "j1"))
    await rt.deliver(granted("a2", "j2", node="n2"))
    event = await rt.deliver(lost("n1"))
    [decided] = rt.emitted(ReclaimDecided)
    assert (decided.allocation_id, decided.reason, decided.attempt) == ("a1", "NodeLost", 1)
    assert [(r.allocation_id, r.reason) for r in released] == [("a1", "NodeLost")]  # after the commit
    assert fake.trackers["a2"]["reclaim_reason"] is None and fake.abnormal == {"j1": 1}

    await rt.deliver(lost("n1"), event=event)
    assert len(rt.emitted(ReclaimDecided)) == 1 and fake.abnormal == {"j1": 1} and len(released) == 1


async def test_past_the_restart_limit_an_abnormal_reclaim_ends_the_job(reclamation) -> None:  # type: ignore[no-untyped-def]
    rt, fake, _ = reclamation
    fake.abnormal["j1"] = 1  # it lost its GPUs once already; the limit is 1
    await rt.deliver(granted("a1", "j1"))
    await rt.deliver(NodeCordoned(cluster="c1", node="n1", drain=True, reason="maintenance", cordoned_at=NOW))
    [decided] = rt.emitted(ReclaimDecided)
    assert (decided.reason, decided.attempt) == ("RestartLimitReached", 2)
    assert "more than the 1 restarts allowed" in decided.message


async def test_a_plain_cordon_and_a_released_allocation_take_nothing_back(reclamation) -> None:  # type: ignore[no-untyped-def]
    rt, fake, released = reclamation
    await rt.deliver(granted("a1", "j1"))
    await rt.deliver(NodeCordoned(cluster="c1", node="n1", drain=False, cordoned_at=NOW))
    assert rt.emitted() == [] and fake.trackers["a1"]["reclaim_reason"] is None
    await rt.deliver(AllocationReleased(allocation_id="a1", job_id="j1", team="research", project="default",
                                        cluster="c1", node="n1", gpus=[], granted_at=NOW, released_at=NOW,
                                        reason="JobCompleted"))
    await rt.deliver(lost("n1"))
    assert fake.trackers == {} and rt.emitted() == [] and released == []


async def test_a_policy_outside_its_bounds_is_refused(reclamation) -> None:  # type: ignore[no-untyped-def]
    rt, _, _ = reclamation
    reply = await rt.request(subjects.CMD_RECLAMATION_SET_POLICY, {"kind": "batch", "idle_util_pct": 250})
    assert reply.error is not None and (reply.error.status, reply.error.reason) == (400, "InvalidRequest")


async def test_a_reclaim_of_an_allocation_placement_released_already_is_forgotten_not_asked_for_again(  # type: ignore[no-untyped-def]
        reclamation) -> None:
    """A release can overtake its grant's event (both reach reclamation on their own consumers): the tracker made
    from the late grant is reclaimed with its node, placement says it released it already, and the tracker goes —
    kept, its release would be asked for after every event handled. One released now waits for its event."""
    rt, fake, released = reclamation
    await rt.deliver(granted("early", "j1"))
    await rt.deliver(granted("a2", "j2"))
    await rt.deliver(lost("n1"))
    assert sorted(r.allocation_id for r in released) == ["a2", "early"]
    assert list(fake.trackers) == ["a2"] and fake.trackers["a2"]["reclaim_reason"] == "NodeLost"
    await rt.deliver(granted("a3", "j3", node="n2"))  # the next event asks for a2 again, not for early
    assert [r.allocation_id for r in released].count("early") == 1
