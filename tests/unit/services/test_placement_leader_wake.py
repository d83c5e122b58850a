"""Placement replicas share one durable consumer, so a follower applies some events. After its commit it must wake
the leader (core NATS), and only the leader acts on that wake."""

from __future__ import annotations

from types import SimpleNamespace

from libs.contracts import subjects
from services.placement.config import PlacementSettings
from services.placement.handlers import PlacementHandlers


class Nats:
    def __init__(self) -> None:
        self.published: list[tuple[str, bytes]] = []

    async def publish(self, subject: str, payload: bytes) -> None:
        self.published.append((subject, payload))


def replica(leader: bool, nc: Nats) -> PlacementHandlers:
    runtime = SimpleNamespace(nc=nc)
    return PlacementHandlers(runtime, PlacementSettings(), SimpleNamespace(is_leader=leader))  # type: ignore[arg-type]


async def test_a_follower_that_applied_a_change_wakes_the_leader_and_only_the_leader_schedules_for_it() -> None:
    bus = Nats()
    leader, follower = replica(True, bus), replica(False, bus)

    await leader._wake()
    assert bus.published == [] and leader._kick.is_set()  # the leader schedules itself; nobody else to tell

    await follower._wake()
    assert bus.published == [(subjects.PLACEMENT_WAKE, b"")]

    leader._kick.clear()
    follower._kick.clear()
    for handlers in (leader, follower):  # every replica subscribes to the wake
        await handlers.on_leader_wake(None)
    assert leader._kick.is_set()
    assert not follower._kick.is_set()


async def test_a_single_replica_without_a_lease_never_publishes_wakes() -> None:
    bus = Nats()
    alone = PlacementHandlers(SimpleNamespace(nc=bus), PlacementSettings(), None)  # type: ignore[arg-type]
    await alone._wake()
    assert bus.published == [] and alone._kick.is_set()
