"""Service replicas on the node: the health rule (pure), ports in the environment, and the keeper's decisions —
announce ready and unready, restart an unhealthy or crashed replica on its allocation a bounded number of times,
drain a replica placement stops before its stop signal, never restart one placement stopped."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import pytest
from pydantic import ValidationError

from libs.contracts.events import AllocatedGpu, AllocationGranted, EndpointReady, EndpointUnready
from libs.contracts.work import HealthCheck, WorkSpec
from services.agent.domain import (
    RESTARTS_IN_PLACE,
    ReplicaHealth,
    endpoint_url,
    health_step,
    port_environment,
    restart_in_place,
)
from services.agent.replicas import ReplicaKeeper

NOW = datetime(2026, 12, 1, tzinfo=UTC)


def step(h: ReplicaHealth, ok: bool, since: float = 100.0) -> tuple[ReplicaHealth, str | None]:
    return health_step(h, ok, since_start_s=since, grace_s=30, failures=3)


def test_a_replica_is_ready_on_its_first_healthy_probe_and_restarted_after_failures_in_a_row() -> None:
    h, what = step(ReplicaHealth(), True)
    assert (h.ready, what) == (True, "ready")
    assert step(h, True) == (h, None)  # no change, no news
    h, what = step(h, False)
    h, what2 = step(h, False)
    assert (h.ready, h.failures, what, what2) == (True, 2, None, None)  # still ready below the threshold
    h = step(h, True)[0]
    assert h.failures == 0  # one success clears the count
    h = step(step(h, False)[0], False)[0]
    assert step(h, False) == (ReplicaHealth(False, 0), "restart")  # the third in a row


def test_probes_during_the_grace_do_not_count_until_the_replica_was_ready_once() -> None:
    h = ReplicaHealth()
    for _ in range(10):
        h, what = step(h, False, since=5)
        assert what is None
    assert h == ReplicaHealth()
    assert step(ReplicaHealth(False, 2), False, since=31) == (ReplicaHealth(False, 0), "restart")


def test_only_a_replica_with_a_health_check_that_placement_did_not_stop_restarts_in_place_a_bounded_number_of_times() -> None:
    assert restart_in_place(has_health=True, stopped_by_placement=False, restarts=0)
    assert not restart_in_place(has_health=True, stopped_by_placement=False, restarts=RESTARTS_IN_PLACE)
    assert not restart_in_place(has_health=True, stopped_by_placement=True, restarts=0)
    assert not restart_in_place(has_health=False, stopped_by_placement=False, restarts=0)


def test_ports_reach_the_environment_and_the_endpoint_is_the_first_one_on_the_nodes_address() -> None:
    env = port_environment({"http": 8000, "grpc-api": 9000}, "10.0.0.7")
    assert env == {"PORT": "8000", "PORT_HTTP": "8000", "PORT_GRPC_API": "9000", "GPUPOOL_NODE_ADDRESS": "10.0.0.7"}
    assert endpoint_url("10.0.0.7", {"http": 8000, "grpc-api": 9000}) == "http://10.0.0.7:8000"
    assert endpoint_url("fd00::7", {"http": 8000}) == "http://[fd00::7]:8000"


def test_health_checks_and_ports_are_checked_at_the_edge() -> None:
    with pytest.raises(ValidationError, match="exactly one of"):
        HealthCheck(http="/h", tcp="http")
    with pytest.raises(ValidationError, match="needs a port"):
        WorkSpec(command=["x"], health={"http": "/healthz"})
    with pytest.raises(ValidationError, match="not in ports"):
        WorkSpec(command=["x"], ports=["http"], health={"tcp": "grpc"})
    with pytest.raises(ValidationError, match="named once"):
        WorkSpec(command=["x"], ports=["http", "http"])
    with pytest.raises(ValidationError):
        WorkSpec(command=["x"], ports=["Bad_Name"])
    with pytest.raises(ValidationError, match="timeout_s"):
        HealthCheck(exec=["true"], interval_s=1, timeout_s=2)


def grant(allocation_id: str = "a1", health: dict | None = None) -> AllocationGranted:
    return AllocationGranted(
        allocation_id=allocation_id, job_id="svc", team="t", project="p", cluster="c", node="n1", replica=1,
        gpus=[AllocatedGpu(uuid="GPU-1", index=0, model="H100")], granted_at=NOW, kind="inference",
        work=WorkSpec(command=["serve"], ports=["http"], health=health or {"exec": ["true"], "interval_s": 0.1,
                                                                           "timeout_s": 0.1}))


async def until(probe, timeout_s: float = 3.0) -> None:  # type: ignore[no-untyped-def]
    """Let the keeper's watch run until `probe()` holds (at most `timeout_s`; the assertion after says what)."""
    for _ in range(int(timeout_s / 0.05)):
        if probe():
            return
        await asyncio.sleep(0.05)


class Harness:
    def __init__(self) -> None:
        self.published: list = []
        self.stops: list = []
        self.relaunched: list = []
        self.keeper = ReplicaKeeper("c", "n1", "127.0.0.1", self.publish, self.stop, self.relaunch)

    async def publish(self, event, identity: str) -> None:  # type: ignore[no-untyped-def]
        self.published.append(event)

    async def stop(self, allocation_id: str, deadline, reason: str) -> None:  # type: ignore[no-untyped-def]
        self.stops.append((allocation_id, reason))

    def relaunch(self, g: AllocationGranted, restart: int) -> None:
        self.relaunched.append((g.allocation_id, restart))

    def kinds(self) -> list[str]:
        return ["ready" if isinstance(e, EndpointReady) else "unready:" + e.reason for e in self.published]


async def test_a_healthy_replica_is_announced_and_a_crashed_one_restarts_in_place_until_it_keeps_failing() -> None:
    h = Harness()
    g = grant()
    env = h.keeper.environment(g)
    port = int(env["PORT"])
    assert h.keeper.environment(g)["PORT"] == str(port)  # one set of ports per allocation, kept
    h.keeper.started(g, {"PATH": "/usr/bin:/bin"})
    await until(lambda: h.published)
    assert h.kinds() == ["ready"]
    ready = h.published[0]
    assert (ready.url, ready.ports, ready.replica) == (f"http://127.0.0.1:{port}", {"http": port}, 1)
    assert await h.keeper.ended(g, "Signalled", final=False)  # crashed: restarted on its allocation
    assert h.kinds() == ["ready", "unready:Signalled"] and h.relaunched == [("a1", 1)]
    for n in range(2, RESTARTS_IN_PLACE + 1):  # never ready again in between
        assert await h.keeper.ended(g, "NonZeroExit", final=False)
        assert h.relaunched[-1] == ("a1", n)
    assert not await h.keeper.ended(g, "NonZeroExit", final=False)  # keeps failing: its end is reported
    h.keeper.forget("a1")


async def test_an_unhealthy_replica_leaves_the_endpoints_and_is_stopped_for_a_restart() -> None:
    h = Harness()
    g = grant(health={"exec": ["false"], "interval_s": 0.1, "timeout_s": 0.1, "grace_s": 0, "failures": 2})
    h.keeper.environment(g)
    h.keeper.started(g, {"PATH": "/usr/bin:/bin"})
    await until(lambda: h.stops)
    assert h.stops == [("a1", "HealthCheckFailed")]
    assert h.kinds() == []  # never ready: nothing to take out of rotation
    assert await h.keeper.ended(g, "Stopped", final=False)
    assert h.relaunched == [("a1", 1)]


async def test_a_replica_placement_stops_is_drained_first_and_never_restarted() -> None:
    h = Harness()
    g = grant()
    h.keeper.environment(g)
    h.keeper.started(g, {"PATH": "/usr/bin:/bin"})
    await until(lambda: h.published)
    await h.keeper.draining(g, "ScaledDown")
    assert h.kinds() == ["ready", "unready:Draining"]
    assert isinstance(h.published[-1], EndpointUnready) and "ScaledDown" in h.published[-1].message
    assert not await h.keeper.ended(g, "Stopped", final=False)
    assert h.relaunched == [] and h.kinds() == ["ready", "unready:Draining"]  # no second unready
    h.keeper.forget("a1")


async def test_a_probe_with_no_port_to_reach_is_unhealthy_not_a_crashed_watch() -> None:
    """A replica whose ports are not (or no longer) known: its watch used to die of a StopIteration."""
    from services.agent.endpoints import probe

    assert await probe(HealthCheck(http="/health"), "127.0.0.1", {}, env={}, uid=None) == (False, "no port to probe")
    assert await probe(HealthCheck(tcp="grpc"), "127.0.0.1", {"http": 1}, env={}, uid=None) == (
        False, "no port grpc to probe")
