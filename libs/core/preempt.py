"""Preemption search: decide victims for a blocked job (never act on them).

Candidates: running, preemptible work past its minimum runtime, of priority no higher than the preemptor; from the
preemptor's own team only when strictly lower priority (`PreemptedByPriority`), from another team only when the
preemptor's team is within its guarantee and the victim's team borrows (`ReclaimedForGuarantee`; only after the
victim ran `policy.reclaim_min_runtime_s`: hysteresis against reclaiming the same borrower again and again). Candidates are
tried cheapest first (GPU-time lost, then priority), released tentatively on the state's journal until the job
fits, the set is minimised, and everything is rolled back: the plan carries the decision only.

Preemption cost (a ski-rental rule): a preempted job restarts, so its work so far is lost. Below
`policy.preempt_at_once_priority`, a job preempts only once its own waiting (GPU demand x time waited) has cost as
much as the work its victims had done when it arrived, or it has waited `policy.max_preemption_wait_s` (which
bounds how late a guarantee is given back). Until then capacity may well free up by itself; after it, waiting
longer would cost more than preempting would have at the start (rent until the rent paid equals the price of
buying). Victims that started after the job arrived cost nothing under the rule.

A job its quota refuses (`find_quota_victims`, Kueue's `withinClusterQueue` and reclaim within the cohort) may
make room within that quota: lower-priority work of its own quota subtree (its team; its project when only the
project's quota refuses) is preempted as `PreemptedWithinQuota`, and when its team stays within its guarantee,
other teams' borrowed work as `ReclaimedForGuarantee` (a quota entry above the teams, an org's, counts what they
borrow, so reclaiming it is what makes room there). Victims in Kueue's order: other teams' borrowed work first,
then the lowest priority, then the most recently started; the set is then minimised (each victim but the last
added back, latest first, while the job is still admitted and fits).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from libs.core.fit import CPU_KIND, FRAC_KIND, MIG_KIND, Shape
from libs.core.model import MIG, WHOLE, JobRequest
from libs.core.plan import WaitFacts
from libs.core.policy import Policy
from libs.core.quota import QuotaLedger
from libs.core.reasons import PREEMPTED_BY_PRIORITY, PREEMPTED_WITHIN_QUOTA, RECLAIMED_FOR_GUARANTEE
from libs.core.state import ClusterState, RunningJob, Take


@dataclass(frozen=True, slots=True)
class Victims:
    """What the preemptor may take once these are gone: each victim with why (PreemptedByPriority or
    ReclaimedForGuarantee), and the node indices the preemptor will start on."""

    chosen: tuple[tuple[str, str], ...]
    nodes: tuple[int, ...]
    considered: int = 0  # candidates the search weighed


@dataclass(frozen=True, slots=True)
class NotYet:
    """Victims exist, but preempting them now would throw away more work than waiting has cost (the ski-rental
    rule): `wait` says so, for the job's pending reason."""

    wait: WaitFacts
    considered: int = 0


@dataclass(frozen=True, slots=True)
class NoVictims:
    """No set of victims makes room (`considered`: the candidates weighed)."""

    considered: int = 0


@dataclass(frozen=True, slots=True)
class Preemptor:
    """The blocked job a search is for, and how to try it on the state: `fits_node(idx)` (one member on one
    node), `place()` (the whole job, on the state's journal: the caller's search rolls it back); `demand` is its
    GPU demand in milli (the most over the models it may use), for the waiting cost."""

    job: JobRequest
    shape: Shape
    allowed: frozenset
    priority: int
    reclaim: bool  # its team is within its guarantee: borrowers of other teams are candidates too
    demand: int
    fits_node: Callable[[int], bool]
    place: Callable[[], list[Take] | None]


_BY_TEAM = object()  # find_victims' memo: the candidates by team
_LOWEST = object()  # and each team's lowest priority among them
INF = math.inf


def find_victims(state: ClusterState, candidates: Iterable[RunningJob], pre: Preemptor, ledger: QuotaLedger,
                 taken: set[str], policy: Policy, now: float, memo: dict | None = None,
                 weighed: tuple | None = None) -> Victims | NotYet | NoVictims:
    """Decide victims (never act) among `candidates` (running work preemptible now), none of `taken` (victims
    and jobs placed earlier in the cycle): same team and lower priority, or borrowers when the job's team is
    within its guarantee. Never a victim of higher priority than the preemptor. NoVictims: no set of victims
    makes room. `memo`: as `victim_candidates`; `weighed`: what `victim_candidates` just gave for this job."""
    if weighed is None:
        weighed = victim_candidates(state, candidates, pre.job, pre.shape, pre.allowed, pre.priority, pre.reclaim,
                                    ledger, taken, policy, now, memo)
    cands, budget, by_node = weighed
    if not cands:
        return NoVictims(0)
    got = _search(state, cands, budget, by_node, pre, policy, now)
    n = len(cands)
    if got is None:
        return NoVictims(n)
    return NotYet(got.wait, n) if isinstance(got, NotYet) else Victims(got.chosen, got.nodes, n)


def victim_candidates(st: ClusterState, candidates: Iterable[RunningJob], job: JobRequest, shape: Shape,
                      allowed: frozenset, prio: int, reclaim: bool, ledger: QuotaLedger, taken: set[str],
                      policy: Policy, now: float, memo: dict | None = None) -> tuple[list[tuple], dict, dict]:
    """The candidates `find_victims` weighs for the job, cheapest first, each team's reclaim budget and the
    candidates on each node (no candidates: no search, and no `Preemptor` is needed to know it). `memo` (one
    cycle's, the same `candidates` and `now` throughout): the candidates of one kind of search, kept while nothing
    was placed, chosen or borrowed since, and the candidates by team (without a reclaim, only the preemptor's own
    team's work can be chosen)."""
    if memo is None or job.job_id in st.running:
        return _candidates(st, candidates, job, shape, allowed, prio, reclaim, ledger, taken, policy, now)
    key = (job.team, prio, reclaim, None if shape.kind == CPU_KIND else allowed, len(taken), ledger.version)
    hit = memo.get(key)
    if hit is None:
        if not reclaim:  # only its own team's work can be a victim: look at that alone (same order)
            by_team = memo.get(_BY_TEAM)
            if by_team is None:
                by_team, lowest = memo[_BY_TEAM], memo[_LOWEST] = {}, {}
                for rj in candidates:
                    by_team.setdefault(rj.team, []).append(rj)
                    if rj.priority < lowest.get(rj.team, INF):
                        lowest[rj.team] = rj.priority
            if memo[_LOWEST].get(job.team, INF) >= prio:  # none of its team's work is below it: no candidate
                hit = memo[key] = ([], {}, {})
                return hit
            candidates = by_team.get(job.team, ())
        hit = memo[key] = _candidates(st, candidates, job, shape, allowed, prio, reclaim, ledger, taken, policy,
                                      now)
    return hit


def _candidates(st: ClusterState, candidates: Iterable[RunningJob], job: JobRequest, shape: Shape,
                allowed: frozenset, prio: int, reclaim: bool, ledger: QuotaLedger, taken: set[str], policy: Policy,
                now: float) -> tuple[list[tuple], dict[str, int], dict]:
    """find_victims' candidates, cheapest first, each team's reclaim budget, and the candidates on each node."""
    budget: dict[str, int] = {}
    lent: dict[tuple, int] = {}  # (team path, models) -> what the team borrows of them (the ledger is fixed here)
    cands: list[tuple] = []
    for rj in candidates:
        if rj.job_id in taken or rj.job_id == job.job_id or rj.priority > prio:
            continue
        if shape.kind != CPU_KIND and allowed.isdisjoint(rj.milli_by_model):
            continue
        if rj.team == job.team and rj.priority < prio:
            why = PREEMPTED_BY_PRIORITY
        elif rj.team != job.team and reclaim:
            if not _reclaimable(rj, ledger, policy.reclaim_min_runtime_s, now, budget, lent):
                continue
            why = RECLAIMED_FOR_GUARANTEE
        else:
            continue
        milli = sum(rj.milli_by_model.values())
        lost = milli * max(0.0, now - rj.started_at)
        cands.append((rj.priority, lost, rj.job_id, why, milli, rj.team, rj.started_at))
    cands.sort(key=lambda c: (c[1], c[0], c[2]))  # least GPU-time lost first: the youngest, smallest victims
    by_node: dict[int, list[tuple]] = {}
    for c in cands:
        for t in st.holds.get(c[2], []):
            by_node.setdefault(t.node, []).append(c)
    return cands, budget, by_node


def _reclaimable(rj: RunningJob, ledger: QuotaLedger, min_runtime_s: float, now: float, budget: dict[str, int],
                 lent: dict[tuple, int]) -> bool:
    """Another team's running job may be reclaimed for a guarantee: it ran at least `min_runtime_s` (the reclaim
    hysteresis) and its team borrows the models it holds. Records in `budget` how much that team borrows (the most
    a search may take back from it); `lent` memoises the borrowed sums per (team, models) within one search."""
    if now - rj.started_at < min_runtime_s:
        return False
    key = (ledger.paths(rj.team, rj.project)[1], tuple(rj.milli_by_model))
    borrowed = lent.get(key)
    if borrowed is None:
        borrowed = lent[key] = sum(ledger.borrowed(key[0], m) for m in rj.milli_by_model)
    if borrowed <= 0:
        return False
    budget.setdefault(rj.team, borrowed)
    return True


def _search(st: ClusterState, cands: list[tuple], budget: dict[str, int], by_node: dict, pre: Preemptor,
            policy: Policy, now: float) -> Victims | NotYet | None:
    """find_victims' search over its candidates: the cheapest set that makes room, per node or for a gang."""
    shape, allowed = pre.shape, pre.allowed

    def release_set(sel: list[tuple]) -> int:
        mark = st.mark()
        for c in sel:
            st.release(c[2])
        return mark

    def within_budget(sel: list[tuple]) -> bool:
        return _within_budget(sel, budget)

    def minimise(sel: list[tuple], fits) -> list[tuple]:
        for c in sorted(sel, key=lambda c: (-c[1], -c[0], c[2])):  # drop the most expensive first
            trial = [x for x in sel if x is not c]
            mark = release_set(trial)
            ok = fits()
            st.rollback(mark)
            if ok:
                sel = trial
        return sel

    if shape.members == 1:
        best = None
        for idx in sorted(by_node):
            ns = st.nodes[idx]
            if ns.hidden or not ns.schedulable or not _may_fit(st, idx, by_node[idx], shape, allowed):
                continue
            sel: list[tuple] = []
            mark = st.mark()
            ok = False
            for c in by_node[idx]:
                if c[2] in {x[2] for x in sel}:
                    continue
                sel.append(c)
                if not within_budget(sel):
                    sel.pop()
                    continue
                st.release(c[2])
                if pre.fits_node(idx):
                    ok = True
                    break
            st.rollback(mark)
            if not ok:
                continue
            sel = minimise(sel, lambda idx=idx: pre.fits_node(idx))
            key = (sum(c[1] for c in sel), max(c[0] for c in sel), len(sel), idx)
            if best is None or key < best[0]:
                best = (key, sel, idx)
        if best is None:
            return None
        wait = waiting_pays(policy, pre, best[1], now)
        if wait is not None:
            return NotYet(wait)
        return Victims(tuple((c[2], c[3]) for c in best[1]), (best[2],))

    # gangs: release cheapest victims until the whole gang fits, then drop the ones not needed
    def gang_fits() -> bool:
        mark = st.mark()
        ok = pre.place() is not None
        st.rollback(mark)
        return ok

    sel = []
    mark = st.mark()
    ok = False
    for c in cands[:256]:
        sel.append(c)
        if not within_budget(sel):
            sel.pop()
            continue
        st.release(c[2])
        if gang_fits():
            ok = True
            break
    st.rollback(mark)
    if not ok:
        return None
    sel = minimise(sel, gang_fits)
    wait = waiting_pays(policy, pre, sel, now)
    if wait is not None:
        return NotYet(wait)
    mark = release_set(sel)
    takes = pre.place() or []
    nodes = tuple(sorted({t.node for t in takes}))
    st.rollback(mark)
    return Victims(tuple((c[2], c[3]) for c in sel), nodes)


def _may_fit(st: ClusterState, idx: int, cands: list[tuple], shape: Shape, allowed: frozenset) -> bool:
    """False only when the one-member job could not fit node `idx` even with every candidate there gone (CPU,
    memory, and GPUs of an allowed model free enough): the search skips such a node without trying releases. Only
    a necessary condition (budgets, NVLink, MIG layouts are left to the search), so it never changes an answer."""
    if shape.kind == MIG_KIND:
        return True
    ns = st.nodes[idx]
    cpu, mem = ns.cpu_free, ns.mem_free
    extra: dict[int, tuple[int, int]] = {}  # GPU position -> (milli, memory) the candidates hold there
    for c in cands:
        for t in st.holds.get(c[2], ()):
            if t.node != idx:
                continue
            cpu += t.cpu
            mem += t.mem
            if t.mig is None:
                for pos in t.positions:
                    m, g = extra.get(pos, (0, 0))
                    extra[pos] = (m + t.milli, g + t.gpu_mem)
    if (ns.cpu_cap and cpu < shape.cpu) or (ns.mem_cap and mem < shape.mem):
        return False
    if shape.kind == CPU_KIND:
        return True
    frac = shape.kind == FRAC_KIND
    need = 1 if frac else shape.per_node
    n = 0
    for pos, g in enumerate(ns.gpus):
        if not g.healthy or g.sharing == MIG or g.model not in allowed:
            continue
        m, gm = extra.get(pos, (0, 0))
        if (g.free + m >= shape.milli and g.free_mem + gm >= shape.gmem) if frac else g.free + m >= WHOLE:
            n += 1
            if n >= need:
                return True
    return False


def _room_anywhere(st: ClusterState, sel: list[tuple], pre: QuotaPreemptor) -> bool:
    """False only when no node could take the one-node job even with every victim of `sel` gone (`_may_fit`, a
    necessary condition): then releasing them, which costs a placement search, cannot make room either."""
    if pre.shape is None:
        return True
    by_node: dict[int, list[tuple]] = {}
    for c in sel:
        for t in st.holds.get(c[2], ()):
            by_node.setdefault(t.node, []).append(c)
    models = frozenset(m for m, _ in pre.amounts)
    return any(_may_fit(st, ns.idx, by_node.get(ns.idx, []), pre.shape, models)
               for ns in st.nodes if ns.schedulable and not ns.hidden)


def _within_budget(sel: list[tuple], budget: dict[str, int]) -> bool:
    spent: dict[str, int] = {}
    for c in sel:
        if c[3] == RECLAIMED_FOR_GUARANTEE:
            # a victim is fair game while its team still borrows (Kueue's rule): jobs are indivisible,
            # so the last one may take the team below its guarantee
            if spent.get(c[5], 0) >= budget.get(c[5], 0):
                return False
            spent[c[5]] = spent.get(c[5], 0) + c[4]
    return True


@dataclass(frozen=True, slots=True)
class QuotaPreemptor:
    """A job its quota refuses: its quota path (org, team, project), what it would take of each model it may use
    (`amounts`), whether it may only use its team's guarantee, whether that team stays within its guarantee
    (`reclaim`), its GPU `demand` in milli (for the waiting cost), and `place(models)` (the whole job on the
    state's journal, over those models; the caller's search rolls it back)."""

    job: JobRequest
    paths: tuple[str, str, str]
    priority: int
    amounts: tuple[tuple[str, int], ...]
    guarantee_only: bool
    reclaim: bool
    demand: int
    place: Callable[[frozenset], list[Take] | None]
    monotone: bool = False  # one node's job: whether it fits can only grow as victims go (gangs may not)
    shape: Shape | None = None  # a one-node job's shape: nodes it could never fit are known without a release


def find_quota_victims(state: ClusterState, candidates: Iterable[RunningJob], pre: QuotaPreemptor,
                       ledger: QuotaLedger, taken: set[str], policy: Policy, now: float,
                       memo: dict | None = None) -> Victims | NotYet | NoVictims:
    """Victims that make room within the quota that refuses `pre.job` (module docstring), decided, never acted
    on: once they are gone the job is admitted and fits. NoVictims: no such set. `memo` (one cycle's, the same
    `candidates` and `now` throughout): the candidates of one kind of search and whether their release would
    admit the job, kept while nothing was placed, chosen or borrowed since."""
    st, job, paths = state, pre.job, pre.paths
    refusing = ledger.refusing_paths(paths, pre.amounts, job.job_id, guarantee_only=pre.guarantee_only)
    project_only = refusing <= {paths[2]}  # only the project is full: other projects' work would not help
    key = None
    if memo is not None and job.job_id not in st.running:
        key = ("quota", job.team, job.project, pre.priority, project_only, pre.reclaim,
               tuple(m for m, _ in pre.amounts), len(taken), ledger.version)
        hit = memo.get(key)
        if hit is None:
            hit = memo[key] = _quota_candidates(st, candidates, pre, project_only, ledger, taken, policy, now)
    else:
        hit = _quota_candidates(st, candidates, pre, project_only, ledger, taken, policy, now)
    cands, budget = hit
    n = len(cands)
    if not cands:
        return NoVictims(0)
    akey = (key, pre.amounts, pre.guarantee_only) if key is not None else None
    admitted = memo.get(akey) if memo is not None and akey is not None else None
    if admitted is None:
        admitted = _admitted_without(ledger, pre, cands)
        if memo is not None and akey is not None:
            memo[akey] = admitted
    if not admitted:
        return NoVictims(n)  # not even with every candidate gone would its quota admit it: no release can help

    def fits() -> list[Take] | None:
        allowed, _ = ledger.admissible(paths, pre.amounts, job.job_id, guarantee_only=pre.guarantee_only)
        if not allowed:
            return None
        mark = st.mark()
        takes = pre.place(frozenset(allowed))
        st.rollback(mark)
        return takes

    def without(sel: list[tuple]) -> list[Take] | None:
        """Whether (and where) the job fits with `sel` gone, everything restored after."""
        version = ledger.version
        mark = st.mark()
        for c in sel:
            st.release(c[2])
            ledger.remove(c[7], c[8])
        takes = fits()
        for c in sel:
            for model, milli in c[8].items():
                ledger.add(c[7], model, milli)
        ledger.restore(version)
        st.rollback(mark)
        return takes

    sel: list[tuple] = []
    for c in cands[:256]:  # the victims the scan may take, in order: the budgets depend only on those before
        sel.append(c)
        if not _within_budget(sel, budget):
            sel.pop()
    if pre.monotone and (not _room_anywhere(st, sel, pre) or without(sel) is None):
        return NoVictims(n)  # not even with all of them gone: no shorter run of them can help either
    scan, sel = sel, []
    mark = st.mark()
    version = ledger.version
    ok = False
    for c in scan:
        sel.append(c)
        st.release(c[2])
        ledger.remove(c[7], c[8])
        if fits() is not None:
            ok = True
            break
    for c in sel:
        for model, milli in c[8].items():
            ledger.add(c[7], model, milli)
    ledger.restore(version)
    st.rollback(mark)
    if not ok:
        return NoVictims(n)
    for c in reversed(sel[:-1]):  # minimise: add back each victim but the last, the latest chosen first
        trial = [x for x in sel if x is not c]
        if without(trial) is not None:
            sel = trial
    wait = waiting_pays(policy, pre, sel, now)
    if wait is not None:
        return NotYet(wait, n)
    takes = without(sel) or []
    return Victims(tuple((c[2], c[3]) for c in sel), tuple(sorted({t.node for t in takes})), n)


def _quota_candidates(st: ClusterState, candidates: Iterable[RunningJob], pre: QuotaPreemptor, project_only: bool,
                      ledger: QuotaLedger, taken: set[str], policy: Policy,
                      now: float) -> tuple[list[tuple], dict[str, int]]:
    """find_quota_victims' candidates in Kueue's order (other teams' borrowed work, then the lowest priority, then
    the most recently started) and each team's reclaim budget."""
    job, prio = pre.job, pre.priority
    models = {m for m, _ in pre.amounts}
    budget: dict[str, int] = {}
    lent: dict[tuple, int] = {}
    cands: list[tuple] = []
    for rj in candidates:
        if rj.job_id in taken or rj.job_id == job.job_id or rj.priority > prio:
            continue
        if not (set(rj.milli_by_model) & models):
            continue
        if rj.team == job.team:
            if rj.priority >= prio or (project_only and rj.project != job.project):
                continue
            why = PREEMPTED_WITHIN_QUOTA
        elif pre.reclaim:
            if not _reclaimable(rj, ledger, policy.reclaim_min_runtime_s, now, budget, lent):
                continue
            why = RECLAIMED_FOR_GUARANTEE
        else:
            continue
        milli = sum(rj.milli_by_model.values())
        lost = milli * max(0.0, now - rj.started_at)
        cands.append((rj.priority, lost, rj.job_id, why, milli, rj.team, rj.started_at,
                      ledger.paths(rj.team, rj.project), rj.milli_by_model))
    cands.sort(key=lambda c: (c[3] != RECLAIMED_FOR_GUARANTEE, c[0], -c[6], c[2]))
    return cands, budget


def _admitted_without(ledger: QuotaLedger, pre: QuotaPreemptor, cands: list[tuple]) -> bool:
    """Whether the job's quota would admit it with every candidate's use taken out of the ledger (restored after):
    necessary for any set of victims to make room, and cheap next to trying them one by one. The candidates' use
    is summed per quota path and model first (whole milli-GPUs: the same counts as taking them out one by one)."""
    version = ledger.version
    total: dict[tuple, int] = {}
    for c in cands:
        for model, milli in c[8].items():
            k = (c[7], model)
            total[k] = total.get(k, 0) + milli
    for (vpaths, model), milli in total.items():
        ledger.add(vpaths, model, -milli)
    allowed, _ = ledger.admissible(pre.paths, pre.amounts, pre.job.job_id, guarantee_only=pre.guarantee_only)
    for (vpaths, model), milli in total.items():
        ledger.add(vpaths, model, milli)
    ledger.restore(version)
    return bool(allowed)


def waiting_pays(policy: Policy, pre: Preemptor | QuotaPreemptor, sel: list[tuple], now: float) -> WaitFacts | None:
    """The ski-rental rule (module docstring): None when preempting `sel` now is worth it, else why it waits."""
    job = pre.job
    if pre.priority >= policy.preempt_at_once_priority or not policy.preemption_cost:
        return None
    arrived = min(job.submitted_at, now)
    sunk = sum(c[4] * max(0.0, arrived - c[6]) for c in sel)
    if sunk <= 0:
        return None
    waited_s = max(0.0, now - job.submitted_at)
    if waited_s >= policy.max_preemption_wait_s:
        return None
    demand = pre.demand
    if demand * waited_s >= sunk:
        return None
    return WaitFacts(tuple(str(c[2]) for c in sel), sunk / 1000, demand * waited_s / 1000,
                     policy.max_preemption_wait_s)
