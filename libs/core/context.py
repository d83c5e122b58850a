"""The state of one scheduling cycle (`CycleContext`): what it decides and remembers while it runs."""

from __future__ import annotations

from dataclasses import dataclass, field

from libs.core.cycle import _Laps
from libs.core.model import JobRequest
from libs.core.plan import PendingReason, Placement, Preemption, Reservation
from libs.core.quota import QuotaLedger
from libs.core.state import RunningJob


@dataclass(slots=True)
class CycleContext:
    """Everything one cycle decides and remembers while it runs; made by `Scheduler.cycle`, gone after it."""

    now: float
    jobs: dict[str, JobRequest]  # the pending requests, first of each id
    hist: dict[tuple[str, str], float]  # decayed fair-share history (decayed_history)
    ledger: QuotaLedger
    laps: _Laps | None
    n_groups: int
    meta: dict[str, tuple] = field(default_factory=dict)  # job -> (shape, priority, preemptible, min runtime)
    valid: list[JobRequest] = field(default_factory=list)
    placements: list[Placement] = field(default_factory=list)
    reasons: list[PendingReason] = field(default_factory=list)
    preemptions: list[Preemption] = field(default_factory=list)
    reservations: list[Reservation] = field(default_factory=list)
    reconfigs: dict[tuple[str, str], tuple[list, list]] = field(default_factory=dict)
    reserved: dict[int, tuple[str, float]] = field(default_factory=dict)  # node -> (holder, start by)
    holders: dict[str, int] = field(default_factory=dict)  # holder -> its nodes in `reserved` (`hold`, `unhold`)
    nominated: set[int] = field(default_factory=set)  # nodes a preemptor waits on
    taken: set[str] = field(default_factory=set)  # chosen victims and jobs placed now: not preemptible again
    held_next: dict[str, tuple[list[int], float]] = field(default_factory=dict)  # reservations for next cycle
    eligible_victims: list[RunningJob] = field(default_factory=list)  # preemptible now (past min runtime)
    fail_memo: dict = field(default_factory=dict)  # (shape, models, reservations it may use) -> its reason
    admit_memo: dict = field(default_factory=dict)  # (paths, amounts, ...) -> (ledger version, answer)
    like_memo: dict = field(default_factory=dict)  # a job's `_like` id -> (epoch, its pending reason)
    rendered: dict = field(default_factory=dict)  # a blocked job's facts -> its message
    quota_facts: dict = field(default_factory=dict)  # (shape, quota refusal) -> the facts of a job it refuses
    considered: dict = field(default_factory=dict)  # (id of facts, victims weighed) -> (facts, facts with them)
    epoch: tuple = ()  # `_epoch` now: it moves only while a job is answered in full
    victim_memo: dict = field(default_factory=dict)  # preemption candidates per search kind (preempt.find_victims)
    preempt_fail: dict = field(default_factory=dict)  # searches that found nothing -> candidates they weighed
    reserve_memo: set = field(default_factory=set)  # shapes whose reservation will not get better this cycle
    reserve_tries: int = 0
    draining: bool = False  # a soft hold is being drained for one starving job
    n_searches: int = 0
    blocked_by: str | None = None  # FIFO head of line: the job everything after waits behind
    placed_last: bool = False  # the last job the fair-share order yielded was placed (its team's share moved)
    head_of_line: bool = False  # FIFO: a job that does not fit blocks every job after it
    nodes_by_class: dict[int, int] | None = None  # schedulable nodes per node class (for Unschedulable), on demand

    def hold(self, idx: int, holder: str, start_by: float) -> None:
        """Node `idx` reserved for `holder` (kept with `holders`, so "does this job hold nodes?" costs a lookup)."""
        if idx in self.reserved:
            self.unhold(idx)
        self.reserved[idx] = (holder, start_by)
        self.holders[holder] = self.holders.get(holder, 0) + 1

    def unhold(self, idx: int) -> None:
        holder = self.reserved.pop(idx)[0]
        n = self.holders[holder] - 1
        if n:
            self.holders[holder] = n
        else:
            del self.holders[holder]
