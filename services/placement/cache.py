"""The core's `Scheduler`, kept from one cycle to the next (its node indexes, normalised requests and memos).

Building a `Scheduler` from the snapshot every cycle — every node's free state indexed, every live allocation
bound — was a large part of a cycle on a big fleet. `KeptScheduler` keeps the one the last committed cycle used
and brings it up to date with what changed since: the snapshot placement reads each cycle is compared, unit by
unit, with the allocations the scheduler holds, and only units that differ (released, granted, preempted, changed)
are taken out (`Scheduler.finish`) and bound again as the store has them (`Scheduler.bind_allocation`). The changes
come from the store, not from the events this replica consumed: replicas share one durable consumer, so the
leader does not see every event, but every event's change is in the store it reads.

It is rebuilt from the snapshot whenever what its indexes were built from changes: the nodes and GPUs (any fact
the core reads: schedulable, health, sharing, labels, capacity), the policy, or the host shapes of the
fragmentation mix (its weights alone are taken by `Scheduler.reweigh`). It is trusted only after the cycle's
transaction committed (`committed`): a cycle that failed anywhere, a cycle that preempted or reconfigured MIG
(its victims' state is the store's to say), and a replica that lost the lease (`forget`) rebuild next time.
The plan is the one a scheduler built from the same snapshot gives: tests/unit/services/test_placement_cache.py checks it
over randomized sequences of arrivals, completions, placements and node changes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from libs.core import Allocation, JobRequest, NormalizeMemo, Plan, Policy, Scheduler, Snapshot, mix_of
from libs.core.answers import SameAnswers


def by_unit(running: Iterable[Allocation]) -> dict[str, tuple[Allocation, ...]]:
    """A snapshot's allocations by the unit holding them, in the snapshot's order."""
    out: dict[str, list[Allocation]] = {}
    for a in running:
        out.setdefault(a.job_id, []).append(a)
    return {u: tuple(v) for u, v in out.items()}


@dataclass
class _Kept:
    sched: Scheduler
    nodes: tuple
    policy: Policy
    running: dict[str, tuple[Allocation, ...]]  # what the scheduler holds, as the store had it
    touched: frozenset[str]  # units the scheduler placed itself (their rows, if committed, come next cycle)


class KeptScheduler:
    def __init__(self) -> None:
        self._kept: _Kept | None = None
        self._in_flight: _Kept | None = None
        self._lost = "none yet"  # why none is kept: "none yet", "not committed", "preempted", "forgotten"
        self.rebuilt = ""  # why the last cycle built a new scheduler ("" when it kept one)
        self.build_s = 0.0  # the last cycle's time to build or update the scheduler
        self._answers = SameAnswers()  # each unchanged pending reason, last cycle's very object
        self._specs: dict = {}  # each request's workload spec (mix_of's memo)

    def forget(self) -> None:
        """Never trust the kept scheduler again (an error, another replica led meanwhile)."""
        self._kept = self._in_flight = None
        self._lost = "forgotten"

    def plan(self, snapshot: Snapshot, requests: list[JobRequest], policy: Policy, now: float,
             clock: Callable[[], float] | None = None, memo: NormalizeMemo | None = None) -> Plan:
        """`libs.core.schedule(snapshot, requests, policy, now, clock, memo)`, on the kept scheduler when it can be."""
        started = clock() if clock is not None else 0.0
        workload = policy.workload or (mix_of(requests, policy, self._specs) if policy.setting("w_frag") else ())
        running = by_unit(snapshot.running)
        kept, self._kept, self._in_flight = self._kept, None, None  # trusted again only after a commit
        why = self._lost if kept is None else _why_rebuild(kept, snapshot, policy)
        if kept is not None and not why and not kept.sched.reweigh(workload):
            why = "mix"
        self._lost = "not committed"
        if kept is not None and not why and not _feed(kept.sched, kept, running):
            why = "mig"
        if kept is None or why:
            sched = Scheduler(snapshot, policy, workload, clock)
        else:
            sched = kept.sched
            sched.history, sched.held, sched.clock = snapshot.usage, {}, clock
        if memo is not None:
            sched.norm_cache = memo.for_policy(policy)
        self.rebuilt, self.build_s = why, (clock() - started) if clock is not None else 0.0
        sched.answers = self._answers
        plan = sched.cycle(requests, now)
        if _keepable(plan):
            self._in_flight = _Kept(sched, snapshot.nodes, policy, running,
                                    frozenset(p.job_id for p in plan.placements))
        else:
            self._lost = "preempted"
        return plan

    def committed(self) -> None:
        """The cycle's transaction committed: its scheduler serves the next cycle."""
        self._kept, self._in_flight = self._in_flight, None


def _keepable(plan: Plan) -> bool:
    """Whether the scheduler's state after `plan` is what one built from the next snapshot would hold (once
    `_feed` brought it there). Not after preemptions or MIG changes: what victims hold next is the store's to say."""
    return not (plan.preemptions or plan.mig_reconfigs)


def _why_rebuild(kept: _Kept | None, snapshot: Snapshot, policy: Policy) -> str:
    if kept is None:
        return ""
    if kept.nodes is not snapshot.nodes and kept.nodes != snapshot.nodes:
        return "nodes"
    if kept.policy != policy:
        return "policy"
    return ""


def _feed(sched: Scheduler, kept: _Kept, running: dict[str, tuple[Allocation, ...]]) -> bool:
    """Bring the scheduler to `running`: every unit that differs from what it holds (or that it placed itself,
    committed or not) is taken out and bound again as the store has it. False, changing nothing, when one of them
    holds a MIG slice: a scheduler keeps a released slice's instance (idle, to reuse), while the store's snapshot
    has exactly the instances live allocations hold (the agent destroys one with its release)."""
    before = kept.running
    changed = set(kept.touched)
    for unit, allocs in running.items():
        # a unit on several nodes is bound again always: a what-if search (victims, reservations) releases and
        # takes back running work, which leaves its nodes in another order, and the first is the one a
        # preemption names; bound again, they are in the snapshot's order, as in a new scheduler
        if len(allocs) > 1 or before.get(unit) != allocs:
            changed.add(unit)
    changed.update(u for u in before if u not in running)
    holds = sched.state.holds
    if any(t.mig is not None for unit in changed for t in holds.get(unit, ())):
        return False
    for unit in sorted(changed):
        sched.finish(unit)
    for unit in sorted(changed):
        for a in running.get(unit, ()):
            sched.bind_allocation(a)
    return True

