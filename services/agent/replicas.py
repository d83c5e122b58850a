"""Service replicas on the node: each replica whose work names `ports` gets free host ports (PORT, PORT_<NAME>) and
an endpoint at its node's address; with a `health` check the agent probes it, announces `endpoint.ready` /
`endpoint.unready`, and restarts an unhealthy or crashed replica on the same allocation (up to
domain.RESTARTS_IN_PLACE times without becoming ready in between: then its end is reported and placement replaces
it). A replica placement stops leaves the endpoint list first (`endpoint.unready`, reason Draining), then gets its
stop signal. One `ReplicaKeeper` per node, driven by the node's WorkRunner."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any

from libs.contracts.envelope import utcnow
from libs.contracts.events import AllocationGranted, EndpointReady, EndpointUnready, EventData
from services.agent.domain import ReplicaHealth, endpoint_url, health_step, port_environment, restart_in_place
from services.agent.endpoints import pick_ports, probe, release_ports

log = logging.getLogger(__name__)
UNHEALTHY_STOP_GRACE_S = 10.0  # an unhealthy replica's stop signal → kill (at most: its own stop_grace_s if less)


class ReplicaKeeper:
    def __init__(self, cluster: str, node: str, address: str, publish: Callable[[EventData, str], Awaitable[None]],
                 stop: Callable[[str, Any, str], Awaitable[None]], relaunch: Callable[[AllocationGranted, int], None],
                 run_as_uid: int | None = None) -> None:
        self.cluster, self.node, self.address = cluster, node, address
        self.publish = publish  # until taken (the runner's _publish_until_taken)
        self.stop = stop  # (allocation, deadline, reason): the executor's stop
        self.relaunch = relaunch  # (grant, restart number): launch the work again on its allocation
        self.run_as_uid = run_as_uid
        self.ports: dict[str, dict[str, int]] = {}  # allocation → name → host port (kept across restarts)
        self.ready: set[str] = set()  # allocations whose endpoint was last announced ready
        self.restarts: dict[str, int] = {}  # restarts in place since the replica was last ready
        self.stopped: set[str] = set()  # placement asked these to stop: never restarted
        self.unhealthy: set[str] = set()  # the agent stopped these for their health
        self.watches: dict[str, asyncio.Task[None]] = {}
        self._sequence = 0

    def serves(self, grant: AllocationGranted) -> bool:
        return grant.work is not None and bool(grant.work.ports or grant.work.health)

    def environment(self, grant: AllocationGranted) -> dict[str, str]:
        """The replica's ports (picked once per allocation) and the node's address, for its environment."""
        assert grant.work is not None
        if not grant.work.ports:
            return {}
        ports = self.ports.get(grant.allocation_id)
        if ports is None:
            ports = self.ports[grant.allocation_id] = pick_ports(list(grant.work.ports), self.address)
        return port_environment(ports, self.address)

    def started(self, grant: AllocationGranted, env: dict[str, str]) -> None:
        """Its work started: announce the endpoint (no health check), or watch its health."""
        if not self.serves(grant):
            return
        old = self.watches.pop(grant.allocation_id, None)
        if old is not None:
            old.cancel()
        self.watches[grant.allocation_id] = asyncio.ensure_future(self._watch(grant, env))

    async def _watch(self, grant: AllocationGranted, env: dict[str, str]) -> None:
        work, aid = grant.work, grant.allocation_id
        assert work is not None
        check = work.health
        if check is None:
            await self._announce(grant, True)
            return
        state, began = ReplicaHealth(), time.monotonic()
        while True:
            await asyncio.sleep(check.interval_s)
            healthy, seen = await probe(check, self.address, self.ports.get(aid, {}), env=env, uid=self.run_as_uid)
            state, what = health_step(state, healthy, since_start_s=time.monotonic() - began,
                                      grace_s=check.grace_s, failures=check.failures)
            if what == "ready":
                self.restarts[aid] = 0
                await self._announce(grant, True)
            elif what == "restart":
                log.warning("replica_unhealthy", extra={"node": self.node, "allocation_id": aid, "seen": seen})
                self.unhealthy.add(aid)
                await self._announce(grant, False, "HealthCheckFailed", seen)
                deadline = utcnow() + timedelta(seconds=min(work.stop_grace_s, UNHEALTHY_STOP_GRACE_S))
                await self.stop(aid, deadline, "HealthCheckFailed")
                return

    async def draining(self, grant: AllocationGranted, reason: str) -> None:
        """Placement stops the replica: it leaves the endpoint list before its stop signal, and stays stopped."""
        self.stopped.add(grant.allocation_id)
        watch = self.watches.pop(grant.allocation_id, None)
        if watch is not None:  # its health no longer matters: it is going
            watch.cancel()
        await self._announce(grant, False, "Draining", f"stopping: {reason}")

    async def ended(self, grant: AllocationGranted, reason: str, *, final: bool) -> bool:
        """Its work ended: out of the endpoint list, and restarted on the same allocation when that is the rule
        (`final`: the agent itself stopped it for another reason, e.g. its fraction's memory). True: restarted."""
        aid = grant.allocation_id
        watch = self.watches.pop(aid, None)
        if watch is not None:
            watch.cancel()
        why = "HealthCheckFailed" if aid in self.unhealthy else reason
        self.unhealthy.discard(aid)
        await self._announce(grant, False, why, f"the work ended ({reason})")
        restarts = self.restarts.get(aid, 0)
        if final or not restart_in_place(has_health=grant.work is not None and grant.work.health is not None,
                                         stopped_by_placement=aid in self.stopped, restarts=restarts):
            return False
        self.restarts[aid] = restarts + 1
        log.info("replica_restarting", extra={"node": self.node, "allocation_id": aid, "restart": restarts + 1,
                                              "after": why})
        self.relaunch(grant, restarts + 1)
        return True

    async def _announce(self, grant: AllocationGranted, ready: bool, reason: str = "", message: str = "") -> None:
        aid = grant.allocation_id
        ports = self.ports.get(aid)
        if not ports or ready == (aid in self.ready):
            return  # no endpoint, or no change
        (self.ready.add if ready else self.ready.discard)(aid)
        common = {"allocation_id": aid, "job_id": grant.job_id, "team": grant.team, "project": grant.project,
                  "cluster": self.cluster, "node": self.node, "replica": grant.replica,
                  "url": endpoint_url(self.address, ports), "ports": ports, "at": utcnow()}
        event: EventData = (EndpointReady(**common) if ready else
                            EndpointUnready(**common, reason=reason[:64], message=message[:2000]))
        self._sequence += 1
        log.info("endpoint_ready" if ready else "endpoint_unready",
                 extra={"node": self.node, "allocation_id": aid, "url": common["url"], "reason": reason})
        await self.publish(event, f"endpoint/{aid}/{time.time_ns()}/{self._sequence}")

    def forget(self, allocation_id: str) -> None:
        """Its allocation's work is over for good."""
        watch = self.watches.pop(allocation_id, None)
        if watch is not None:
            watch.cancel()
        release_ports(self.ports.pop(allocation_id, {}))
        for keep in (self.ready, self.stopped, self.unhealthy):
            keep.discard(allocation_id)
        self.restarts.pop(allocation_id, None)

    def close(self) -> None:
        for watch in self.watches.values():
            watch.cancel()
        self.watches.clear()
