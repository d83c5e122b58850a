"""The agent's start-up and resync listing of placement's live allocations, shared by a process's simulated nodes:
a failure stands for every node until the process's back-off ends (no fetch storm from a thousand nodes)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from libs.bus.rpc import ServiceUnavailable
from services.agent import handlers

pytestmark = pytest.mark.asyncio


@pytest.fixture
def fetches(monkeypatch):  # type: ignore[no-untyped-def]
    """Placement's answers in turn (a list to return, or an exception to raise); the fetches made are counted."""
    answers: list = []
    made: list = []  # the scope of each fetch

    async def fetch(nc, scope):  # type: ignore[no-untyped-def]
        made.append(scope)
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    monkeypatch.setattr(handlers, "_fetch_live", fetch)
    monkeypatch.setattr(handlers, "_SNAPSHOTS", {})
    return answers, made


async def many_nodes_ask(nc: object, subscribed_at: float, nodes: int = 50) -> list:
    """A simulated fleet's nodes, each on a connection of its own, asking for the shared listing."""
    return await asyncio.gather(*(handlers.live_snapshot(object(), subscribed_at) for _ in range(nodes)),  # type: ignore[arg-type]
                                return_exceptions=True)


async def test_a_failed_listing_is_every_nodes_answer_until_the_back_off_ends_then_one_fetch_retries(fetches) -> None:
    answers, made = fetches
    nc = object()
    answers += [ServiceUnavailable("no reply"), [{"allocation_id": "a1"}]]
    first = await many_nodes_ask(nc, 0.0)
    assert len(made) == 1 and all(isinstance(r, ServiceUnavailable) for r in first)
    # each node retries on its own timer: within the back-off the failure stands, nothing is fetched
    again = await many_nodes_ask(nc, 0.0)
    assert len(made) == 1 and all(isinstance(r, ServiceUnavailable) for r in again)
    snap = handlers._SNAPSHOTS[None]
    assert snap.delay == 2 * handlers.SNAPSHOT_RETRY_S[0]  # the next failure waits twice as long
    snap.retry_at = 0.0  # the back-off is over
    after = await many_nodes_ask(nc, 0.0)
    assert len(made) == 2 and all(r == [{"allocation_id": "a1"}] for r in after)
    assert snap.delay == handlers.SNAPSHOT_RETRY_S[0]  # a success starts the back-off over


async def test_the_back_off_doubles_up_to_its_longest(fetches) -> None:
    answers, made = fetches
    nc = object()
    delays = []
    for _ in range(6):
        answers.append(ServiceUnavailable("no reply"))
        await many_nodes_ask(nc, 0.0, nodes=3)
        snap = handlers._SNAPSHOTS[None]
        delays.append(snap.retry_at - handlers.time.monotonic())
        snap.retry_at = 0.0
    assert len(made) == 6
    first, longest = handlers.SNAPSHOT_RETRY_S
    expected = [min(longest, first * 2 ** i) for i in range(6)]
    assert all(abs(d - e) < 0.5 for d, e in zip(delays, expected, strict=True)), delays


async def test_a_node_of_its_own_lists_only_its_node_and_nodes_of_one_process_share_one_listing(fetches) -> None:
    answers, made = fetches
    answers += [[{"allocation_id": "mine"}], [{"allocation_id": "a"}, {"allocation_id": "b"}]]
    assert await handlers.live_snapshot(object(), 0.0, ("local", "n0")) == [{"allocation_id": "mine"}]  # type: ignore[arg-type]
    shared = await many_nodes_ask(object(), 0.0, nodes=20)
    assert made == [("local", "n0"), None] and all(len(r) == 2 for r in shared)


async def test_the_listing_asks_placement_for_the_scope_it_was_given(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    asked: list = []

    async def request(nc, subject, cmd, timeout):  # type: ignore[no-untyped-def]
        asked.append((subject, cmd.cluster, cmd.node, cmd.after))
        return SimpleNamespace(ok=True, result={"items": [{"allocation_id": cmd.after or "p1"}],
                                                "next": None if cmd.after else "p2"})

    monkeypatch.setattr(handlers, "request", request)
    assert await handlers._fetch_live(object(), ("c1", "n7")) == [{"allocation_id": "p1"}, {"allocation_id": "p2"}]  # type: ignore[arg-type]
    assert await handlers._fetch_live(object()) == [{"allocation_id": "p1"}, {"allocation_id": "p2"}]  # type: ignore[arg-type]
    subject = handlers.subjects.QUERY_PLACEMENT_LIST_ALLOCATIONS
    assert asked == [(subject, "c1", "n7", None), (subject, "c1", "n7", "p2"), (subject, None, None, None),
                     (subject, None, None, "p2")]


async def test_a_fleets_nodes_share_one_connection_for_events_and_one_listing_a_lone_node_keeps_its_own() -> None:
    from services.agent.handlers import NodeAgent
    from services.agent.nvml_sim import SimulatedNvml

    class Conn:
        def jetstream(self) -> object:
            return object()

    first, second, alone = Conn(), Conn(), Conn()
    fleet = [NodeAgent(nc, SimulatedNvml(name, ["H100-80GB"], seed=1, clock=lambda: 0.0), "local", name, 1.0,  # type: ignore[arg-type]
                       fleet_nc=first)  # type: ignore[arg-type]
             for nc, name in ((first, "n0"), (second, "n1"))]
    assert [a.events_nc for a in fleet] == [first, first] and [a.nc for a in fleet] == [first, second]
    assert [a.listing_scope for a in fleet] == [None, None]
    lone = NodeAgent(alone, SimulatedNvml("n9", ["H100-80GB"], seed=1, clock=lambda: 0.0), "local", "n9", 1.0)  # type: ignore[arg-type]
    assert lone.events_nc is alone and lone.listing_scope == ("local", "n9")
