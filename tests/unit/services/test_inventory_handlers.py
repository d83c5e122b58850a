"""Inventory's handlers on the fake runtime (libs/runtime/fake.py): registration (on its node's own subject only, a
lost node's re-registration announced as a recovery), cordon and drain, and the allocations placement announces,
through the routing table; the SQL is tested in tests/integration/test_inventory*.py."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from libs.contracts import subjects
from libs.contracts.commands import CordonNode, RegisterNode
from libs.contracts.events import (
    AllocatedGpu,
    AllocationGranted,
    AllocationReleased,
    GpuSharingSet,
    GpuSpec,
    NodeCordoned,
    NodeRecovered,
    NodeRegistered,
    NodeUncordoned,
)
from libs.runtime.fake import FakeRuntime, FakeStore
from services.inventory import handlers, store
from services.inventory.config import InventorySettings
from services.inventory.handlers import InventoryHandlers, routes

NOW = datetime(2026, 1, 1, 12, tzinfo=UTC)


class FakeInventoryStore(FakeStore):
    """The inventory store functions these handlers call, on dicts (as services.inventory.store)."""

    def __init__(self) -> None:
        super().__init__(store)
        self.nodes: dict[tuple[str, str], dict[str, Any]] = {}
        self.gpus: dict[str, dict[str, Any]] = {}
        self.held: dict[str, list[str]] = {}
        self.released: set[str] = set()

    async def upsert_node(self, conn: Any, cmd: RegisterNode, now: datetime) -> dict[str, Any] | None:
        key = (cmd.cluster, cmd.node)
        previous = self.nodes.get(key)
        before = {k: previous[k] for k in ("state", "lost_at", "cordoned")} if previous else None
        self.nodes[key] = (previous or {"cordoned": False, "drained": False}) | {
            "cluster": cmd.cluster, "node": cmd.node, "state": "ready", "lost_at": None, "last_seen_at": now}
        for g in cmd.gpus:
            self.gpus.setdefault(g.uuid, {"uuid": g.uuid, "idx": g.index, "cluster": cmd.cluster, "node": cmd.node,
                                          "state": "healthy", "health": "healthy", "sharing": "exclusive",
                                          "sharing_target": None, "sharing_set_by": None})
        return before

    async def node_gpu_states(self, conn: Any, cluster: str, node: str) -> list[dict[str, Any]]:
        return sorted((dict(g) for g in self.gpus.values() if (g["cluster"], g["node"]) == (cluster, node)),
                      key=lambda g: g["idx"])

    async def find_node(self, conn: Any, cluster: str | None, node: str) -> list[dict[str, Any]]:
        return [{"cluster": c, "node": n} for (c, n) in sorted(self.nodes)
                if n == node and cluster in (None, c)][:2]

    async def lock_node(self, conn: Any, cluster: str, node: str) -> dict[str, Any] | None:
        row = self.nodes.get((cluster, node))
        return {k: row[k] for k in ("state", "cordoned", "drained")} if row else None

    async def set_cordon(self, conn: Any, cluster: str, node: str, *, cordoned: bool, drained: bool, by: str,
                         reason: str, at: datetime) -> None:
        self.nodes[(cluster, node)].update(cordoned=cordoned, drained=drained)

    async def get_node(self, conn: Any, cluster: str, node: str) -> dict[str, Any] | None:
        row = self.nodes.get((cluster, node))
        return {k: row[k] for k in ("cluster", "node", "state", "cordoned", "drained")} if row else None

    async def hold(self, conn: Any, allocation_id: str, job_id: str, team: str, cluster: str, node: str,
                   gpu_uuids: list[str], granted_at: datetime) -> None:
        if allocation_id not in self.released:  # a late grant after its release is not held again
            self.held.setdefault(allocation_id, list(gpu_uuids))

    async def release(self, conn: Any, allocation_id: str, at: datetime) -> list[dict[str, Any]]:
        still = {u for a, uuids in self.held.items() if a != allocation_id for u in uuids}
        switched = []
        for uuid in self.held.get(allocation_id, []):
            g = self.gpus[uuid]
            if g["sharing_target"] is not None and uuid not in still:
                g.update(sharing=g["sharing_target"], sharing_target=None)
                switched.append(dict(g))
        self.held.pop(allocation_id, None)
        self.released.add(allocation_id)
        return switched


@pytest.fixture
async def inventory(monkeypatch: pytest.MonkeyPatch) -> tuple[FakeRuntime, FakeInventoryStore]:
    fake = FakeInventoryStore()
    monkeypatch.setattr(handlers, "store", fake)
    rt = FakeRuntime("inventory", stores=(fake,))
    await rt.mount(routes(InventoryHandlers(rt, InventorySettings())))  # type: ignore[arg-type]
    return rt, fake


def registration(node: str = "n1") -> RegisterNode:
    return RegisterNode(cluster="c1", node=node, hostname=node, cpu_count=64, memory_mib=512_000,
                        gpus=[GpuSpec(uuid=f"GPU-{node}-{i}", index=i, model="H100-80GB", memory_mib=81_920)
                              for i in range(2)])


def allocation(event: type, **over: Any) -> Any:
    doc = {"allocation_id": "a1", "job_id": "j1", "team": "research", "project": "default", "cluster": "c1",
           "node": "n1", "granted_at": NOW, "gpus": [AllocatedGpu(uuid="GPU-n1-0", index=0, model="H100-80GB")]}
    return event(**(doc | over))


async def test_a_node_registers_on_its_own_subject_and_is_announced_with_its_gpus(inventory) -> None:  # type: ignore[no-untyped-def]
    rt, fake = inventory
    reply = await rt.request(subjects.register_node("c1", "n1"), registration())
    assert reply.ok and reply.result == {"cluster": "c1", "node": "n1", "gpus": 2}
    [registered] = rt.emitted()
    assert isinstance(registered, NodeRegistered)
    assert [(g.uuid, g.state) for g in registered.gpus] == [("GPU-n1-0", "healthy"), ("GPU-n1-1", "healthy")]
    assert fake.nodes[("c1", "n1")]["state"] == "ready"


async def test_a_node_registering_another_is_refused_and_nothing_is_written(inventory) -> None:  # type: ignore[no-untyped-def]
    rt, fake = inventory
    reply = await rt.request(subjects.register_node("c1", "n1"), registration("n2"))
    assert reply.error is not None and (reply.error.status, reply.error.reason) == (403, "WrongSubject")
    assert fake.nodes == {} and rt.outbox == []


async def test_a_lost_node_that_registers_again_is_announced_as_recovered(inventory) -> None:  # type: ignore[no-untyped-def]
    rt, fake = inventory
    await rt.request(subjects.register_node("c1", "n1"), registration())
    fake.nodes[("c1", "n1")].update(state="lost", lost_at=NOW)
    rt.take_emitted()
    await rt.request(subjects.register_node("c1", "n1"), registration())
    registered, recovered = rt.emitted()
    assert isinstance(registered, NodeRegistered) and isinstance(recovered, NodeRecovered)
    assert (recovered.node, recovered.lost_at) == ("n1", NOW)


async def test_cordon_drain_and_uncordon_announce_each_change_once(inventory) -> None:  # type: ignore[no-untyped-def]
    rt, fake = inventory
    await rt.request(subjects.register_node("c1", "n1"), registration())
    rt.take_emitted()
    cordon = CordonNode(node="n1", action="cordon", by="ops", reason="maintenance")
    first = await rt.request(subjects.CMD_INVENTORY_CORDON_NODE, cordon)
    again = await rt.request(subjects.CMD_INVENTORY_CORDON_NODE, cordon)
    drain = await rt.request(subjects.CMD_INVENTORY_CORDON_NODE, cordon.model_copy(update={"action": "drain"}))
    back = await rt.request(subjects.CMD_INVENTORY_CORDON_NODE, cordon.model_copy(update={"action": "uncordon"}))
    assert [r.result["changed"] for r in (first, again, drain, back)] == [True, False, True, True]
    assert [(type(e), getattr(e, "drain", None)) for e in rt.emitted()] == [
        (NodeCordoned, False), (NodeCordoned, True), (NodeUncordoned, None)]
    assert fake.nodes[("c1", "n1")]["cordoned"] is False


async def test_cordoning_an_unknown_or_ambiguous_node_is_refused(inventory) -> None:  # type: ignore[no-untyped-def]
    rt, _ = inventory
    missing = await rt.request(subjects.CMD_INVENTORY_CORDON_NODE, CordonNode(node="ghost", action="cordon"))
    assert missing.error is not None and (missing.error.status, missing.error.reason) == (404, "NodeNotFound")
    await rt.request(subjects.register_node("c1", "n1"), registration())
    await rt.request(subjects.register_node("c2", "n1"), registration().model_copy(update={"cluster": "c2"}))
    both = await rt.request(subjects.CMD_INVENTORY_CORDON_NODE, CordonNode(node="n1", action="cordon"))
    assert both.error is not None and (both.error.status, both.error.reason) == (409, "AmbiguousNode")
    assert not any(isinstance(e, NodeCordoned) for e in rt.emitted())


async def test_a_release_switches_a_draining_gpu_once_and_a_late_grant_is_not_held_again(inventory) -> None:  # type: ignore[no-untyped-def]
    rt, fake = inventory
    await rt.request(subjects.register_node("c1", "n1"), registration())
    rt.take_emitted()
    grant = await rt.deliver(allocation(AllocationGranted))
    assert fake.held == {"a1": ["GPU-n1-0"]}
    fake.gpus["GPU-n1-0"].update(sharing_target="fractional", sharing_set_by="ops")
    release = await rt.deliver(allocation(AllocationReleased, released_at=NOW, reason="JobCompleted"))
    [switched] = rt.emitted()
    assert isinstance(switched, GpuSharingSet) and (switched.gpu_uuid, switched.mode) == ("GPU-n1-0", "fractional")

    fake.released.clear()  # were the grant's handler to run again, the allocation would be held again
    await rt.deliver(allocation(AllocationGranted), event=grant)
    assert fake.held == {}
    fake.held["a1"] = ["GPU-n1-0"]  # were the release's to run again, it would forget this
    fake.gpus["GPU-n1-0"]["sharing_target"] = "exclusive"  # ... and switch the GPU again
    await rt.deliver(allocation(AllocationReleased, released_at=NOW, reason="JobCompleted"), event=release)
    assert fake.held == {"a1": ["GPU-n1-0"]} and len(rt.emitted()) == 1
