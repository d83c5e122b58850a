"""Reservations for blocked big jobs (Slurm-style backfill): which nodes to hold and from when.

The nodes chosen are those expected to have enough free GPUs soonest, given the running jobs' `max_runtime_s`;
`start_by` is when the last of them is expected to be ready (inf when some end is unknown). The scheduler lets
other work use held nodes only if it ends before `start_by`.
"""

from __future__ import annotations

import math

from libs.core.fit import Shape, gpu_eligible
from libs.core.model import WHOLE
from libs.core.state import ClusterState

INF = math.inf
_NEVER = (INF, INF)


def plan_reservation(state: ClusterState, shape: Shape, allowed: frozenset, now: float,
                     elig_memo: dict) -> tuple[list[int], float] | None:
    """Nodes to hold for a blocked big job of `shape` (models `allowed`), and when they are expected to be free
    enough (Slurm-style): (node indices, start_by), or None when the cluster could never host it. `elig_memo`
    keeps, per (node class, shape, models), the positions of the GPUs that could serve it."""
    st = state
    per = shape.per_node if shape.members else None
    running = st.running
    ready: list[tuple[float, float, int, int, int]] = []  # (time, guessed time, -gpus, idx, gpus)
    for ns in st.nodes:
        if not ns.schedulable or ns.hidden or not shape.selector <= ns.labels:
            continue
        if (ns.cpu_cap and ns.cpu_cap < shape.cpu) or (ns.mem_cap and ns.mem_cap < shape.mem):
            continue  # could never host it, however long we wait
        ek = (ns.cls, shape, allowed)
        elig = elig_memo.get(ek)
        if elig is None:
            elig = elig_memo[ek] = [
                i for i, s in enumerate(st.classes[ns.cls].gpus) if gpu_eligible(s, shape, allowed)
            ]
        if not elig:
            continue
        want = per if per is not None else len(elig)
        if len(elig) < want:
            continue
        gpus = ns.gpus
        busy = {i for i in elig if gpus[i].free != WHOLE}
        short = want - (len(elig) - len(busy))  # GPUs that must still free up
        if short <= 0:
            ready.append((now, now, -len(elig), ns.idx, want))
            continue
        # when each busy GPU's holders are gone: declared (inf when some end is unknown) and guessed. Without a
        # declared end, guess that work runs as long again as it has run (heavy-tailed run times: the young end
        # first); the guess only ranks nodes, `start_by` stays unknown. A busy GPU nobody here holds (held outside
        # the scheduler) never frees as far as we know.
        ends = dict.fromkeys(busy, (-INF, -INF))
        for t in st.on_node[ns.idx].values():
            if t.mig is not None:
                continue
            rj = running.get(t.job_id)
            end = rj.end_at if rj is not None else INF
            guess = end if end < INF else (2 * now - rj.started_at if rj is not None else INF)
            for pos in t.positions:
                e = ends.get(pos)
                if e is not None and (end > e[0] or guess > e[1]):
                    ends[pos] = (max(end, e[0]), max(guess, e[1]))
        times = [e if e[0] > -INF else _NEVER for e in ends.values()]
        t_ready = sorted(e[0] for e in times)[short - 1]
        g_ready = sorted(e[1] for e in times)[short - 1]
        ready.append((t_ready, g_ready, -len(elig), ns.idx, want))
    ready.sort()
    chosen: list[int] = []
    got = 0
    need = shape.members if shape.members else shape.total
    for _t, _g, _, idx, want in ready:
        chosen.append(idx)
        got += 1 if shape.members else want
        if got >= need:
            start_by = max(r[0] for r in ready if r[3] in set(chosen))
            return chosen, start_by
    return None
