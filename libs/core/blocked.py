"""Phases 7 and 8 of a cycle, for a job that does not fit: victims to preempt for it (`preempt.find_victims`,
`preempt.find_quota_victims`), or nodes held for it (`backfill.plan_reservation`). A mixin of `Scheduler`: it
reads the scheduler's state, policy and search (`_place`, `_fits_node`, `_amount`, ...) and records into the
cycle's `CycleContext`."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import replace

from libs.core.backfill import plan_reservation
from libs.core.context import CycleContext
from libs.core.explain import pending as _pending
from libs.core.fit import WHOLE_KIND, Shape
from libs.core.model import JobRequest
from libs.core.plan import Preemption, ReasonFacts, Reservation, with_considered
from libs.core.preempt import (
    NotYet,
    Preemptor,
    QuotaPreemptor,
    Victims,
    find_quota_victims,
    find_victims,
    victim_candidates,
)
from libs.core.reasons import (
    NO_FEASIBLE_NODE,
    PREEMPTED_BY_PRIORITY,
    PREEMPTED_WITHIN_QUOTA,
    PREEMPTING,
    WAITING_FOR_GANG,
)

INF = math.inf


class BlockedPhases:
    """Preemption and reservations for a blocked job (phases 7, 4b and 8 of `Scheduler.cycle`)."""

    def _try_preempt(self, ctx: CycleContext, job: JobRequest, shape: Shape, sid: int, allowed: frozenset,
                     prio: int, paths: tuple[str, str, str], facts: ReasonFacts) -> tuple[bool, ReasonFacts]:
        """7. Victims for the blocked job (decided, never acted on): (True: it waits for them, its reason
        recorded; the facts, with the candidates weighed and why it waits instead when preempting would cost more
        than waiting)."""
        st, ledger = self.state, ctx.ledger
        amounts, demand = self._allowed_amounts(shape, sid, allowed)
        reclaim = self._reclaims(ctx, paths, amounts)  # its team within its guarantee: borrowers are candidates
        pkey = (sid, allowed, job.team, prio, reclaim)
        if pkey in ctx.preempt_fail:  # a job of its kind found nothing this cycle: so would it, among as many
            return False, _considered(ctx, facts, ctx.preempt_fail[pkey])
        ctx.n_searches += 1
        weighed = victim_candidates(st, ctx.eligible_victims, job, shape, allowed, prio, reclaim, ledger, ctx.taken,
                                    self.policy, ctx.now, ctx.victim_memo)
        if not weighed[0]:
            ctx.preempt_fail[pkey] = 0  # nobody to weigh (most searches): no search to set up
            return False, _considered(ctx, facts, 0)
        pre = Preemptor(job=job, shape=shape, allowed=allowed, priority=prio, reclaim=reclaim, demand=demand,
                        fits_node=lambda idx: self._fits_node(idx, shape, sid, allowed),
                        place=lambda: self._place(job, shape, sid, allowed))
        found = find_victims(st, ctx.eligible_victims, pre, ledger, ctx.taken, self.policy, ctx.now,
                             ctx.victim_memo, weighed)
        facts = _considered(ctx, facts, found.considered)
        if not isinstance(found, Victims):
            ctx.preempt_fail[pkey] = found.considered
            return False, replace(facts, wait=found.wait) if isinstance(found, NotYet) else facts
        self._hold_for(ctx, job, prio, found, facts)
        return True, facts

    def _try_quota_preempt(self, ctx: CycleContext, job: JobRequest, shape: Shape, prio: int, preemptible: bool,
                           paths: tuple[str, str, str], facts: ReasonFacts,
                           models: Iterable[str] | None = None) -> tuple[bool, ReasonFacts]:
        """4b. A job its quota refuses: victims that make room within that quota (`preempt.find_quota_victims`:
        lower-priority work of its own team or project, and other teams' borrowed work while its team stays
        within its guarantee). (True: it waits for them, its reason recorded; the refusal, with why it waits
        instead when preempting would cost more than waiting)."""
        ledger = ctx.ledger
        amounts = self._amounts(shape, self._models_for(shape) if models is None else models)
        reclaim = self._reclaims(ctx, paths, amounts)
        pkey = ("quota", self._sid(shape), amounts, job.team, job.project, prio, preemptible, reclaim)
        if pkey in ctx.preempt_fail:
            return False, _considered(ctx, facts, ctx.preempt_fail[pkey])
        ctx.n_searches += 1
        sid = self._sid(shape)
        pre = QuotaPreemptor(job=job, paths=paths, priority=prio, amounts=amounts,
                             guarantee_only=self._guarantee_only(ctx, preemptible), reclaim=reclaim,
                             demand=max((a for _, a in amounts), default=0),
                             place=lambda allowed: self._place(job, shape, sid, allowed),
                             monotone=not shape.is_gang, shape=shape)
        found = find_quota_victims(self.state, ctx.eligible_victims, pre, ledger, ctx.taken, self.policy, ctx.now,
                                   ctx.victim_memo)
        facts = _considered(ctx, facts, found.considered)
        if not isinstance(found, Victims):
            ctx.preempt_fail[pkey] = found.considered
            return False, replace(facts, wait=found.wait) if isinstance(found, NotYet) else facts
        whys = sorted({why for _, why in found.chosen})
        scope = paths[2] if any(w == PREEMPTED_WITHIN_QUOTA for w in whys) and \
            ledger.refusing_paths(paths, amounts, job.job_id, guarantee_only=pre.guarantee_only) <= {paths[2]} \
            else paths[1]
        self._hold_for(ctx, job, prio, found, replace(facts, within_quota=True), scope=scope)
        return True, facts

    def _reclaims(self, ctx: CycleContext, paths: tuple[str, str, str], amounts: tuple[tuple[str, int], ...]) -> bool:
        """Whether the job's team stays within its guarantee taking `amounts` of some model: other teams'
        borrowed work is then fair game (remembered per ledger version, like admission)."""
        key = ("reclaim", paths[1], amounts)
        hit = ctx.admit_memo.get(key)
        if hit is not None and hit[0] == ctx.ledger.version:
            return hit[1]
        got = any(ctx.ledger.within_guarantee(paths, m, a) for m, a in amounts)
        ctx.admit_memo[key] = (ctx.ledger.version, got)
        return got

    def _hold_for(self, ctx: CycleContext, job: JobRequest, prio: int, found: Victims, facts: ReasonFacts,
                  scope: str = "") -> None:
        """The victims into the plan, the preemptor's target nodes held for it into the next cycle, and its
        reason: waiting for them to leave (`facts.within_quota`: made room within its quota, which refused)."""
        st = self.state
        for vid, why in found.chosen:
            ctx.taken.add(vid)
            v = st.running[vid]
            node = st.nodes[st.holds[vid][0].node].name if st.holds.get(vid) else ""
            if why == PREEMPTED_BY_PRIORITY:
                m = f"{job.job_id} (priority {prio}) of team {job.team} needs the capacity; " \
                    f"{vid} has priority {v.priority}"
            elif why == PREEMPTED_WITHIN_QUOTA:
                m = f"{job.job_id} (priority {prio}) needs room within {scope}'s quota; {vid} has priority " \
                    f"{v.priority}"
            else:
                m = f"team {v.team} borrows capacity that team {job.team} is guaranteed " \
                    f"and {job.job_id} is waiting for"
            ctx.preemptions.append(Preemption(vid, node, job.job_id, why, m))
        for idx in found.nodes:
            ctx.nominated.add(idx)
            st.set_hidden(idx, True)
        # held for the preemptor into the next cycle, when the victims are gone
        ctx.held_next[job.job_id] = (list(found.nodes), ctx.now)
        names = tuple(sorted(st.nodes[i].name for i in found.nodes))
        ctx.reasons.append(_pending(job.job_id, PREEMPTING,
                                    replace(facts, victims=found.chosen, victim_nodes=names)))
        if ctx.head_of_line:
            ctx.blocked_by = job.job_id

    def _try_reserve(self, ctx: CycleContext, job: JobRequest, shape: Shape, sid: int, allowed: frozenset,
                     code: str, facts: ReasonFacts) -> ReasonFacts:
        """8. Backfill: nodes held for a blocked big job from when they are expected to be free (a soft hold when
        that is unknown, only for a job that has waited `drain_after_s`). Returns the reason's facts."""
        p, st, now = self.policy, self.state, ctx.now
        if not (p.setting("backfill") and shape.kind == WHOLE_KIND and shape.total >= 2
                and self._kind(job.kind).reserve and code in (NO_FEASIBLE_NODE, WAITING_FOR_GANG)
                and len(ctx.reservations) < p.max_reservations
                and ctx.reserve_tries < 4 * p.max_reservations and (sid, allowed) not in ctx.reserve_memo):
            return facts
        ctx.reserve_tries += 1
        starving = not (now - job.submitted_at < p.drain_after_s or ctx.draining)
        if not self.n_finite and not starving:
            res = None  # no end is known, so the start would be too, and no soft hold is due: skip
        else:
            res = plan_reservation(st, shape, allowed, now, self.elig_memo)
        if res is None or res[1] == INF:
            ctx.reserve_memo.add((sid, allowed))  # the same shape will not get a better answer this cycle
        if res is not None and res[1] == INF and not starving:
            res = None  # nobody knows when the nodes free up: drain them only for one starving job
        if res is None:
            return facts
        idxs, start_by = res
        if start_by == INF:
            ctx.draining = True
        for i in idxs:
            ctx.hold(i, job.job_id, start_by)
            st.set_hidden(i, True)
        ctx.held_next[job.job_id] = (list(idxs), start_by)
        ctx.reservations.append(Reservation(job.job_id, tuple(st.nodes[i].name for i in idxs), start_by,
                                            soft=start_by == INF))
        return replace(facts, reservation_nodes=tuple(st.nodes[i].name for i in idxs), reservation_start=start_by,
                       reservation_in_s=None if start_by == INF else start_by - now)


def _considered(ctx: CycleContext, facts: ReasonFacts, n: int) -> ReasonFacts:
    """`facts` with `victims_considered=n`. Blocked jobs of one kind share one facts object (the reasons' memo),
    so the copy is made once per cycle (`dataclasses.replace` on the 27 fields was a tenth of a deep queue's
    cycle); keyed by identity, the original kept alive beside it so the id is never reused."""
    if facts.victims_considered == n:  # most searches weigh nobody: the facts say so already
        return facts
    key = (id(facts), n)
    hit = ctx.considered.get(key)
    if hit is None or hit[0] is not facts:
        hit = ctx.considered[key] = (facts, with_considered(facts, n))
    return hit[1]
