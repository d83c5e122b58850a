"""What-if capacity: replay a recorded history (`gpupool history export`) through the simulator on the platform's
own pool with more or fewer nodes of one GPU model, and find the smallest size that keeps the p90 queue wait of the
jobs that model served under a target.

Pure and deterministic: the same core and engine as `gpupool sim replay`, no randomness (the history names its
teams), so the same history and pool give the same answer. A job that never starts in a replay (it does not fit the
smaller pool, or is still queued when the history runs out) waits forever, so a pool that cannot run the history's
jobs never passes.
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from dataclasses import dataclass

from libs.core import DEFAULT_PRIORITY_CLASSES, Node
from libs.sim import engine
from libs.sim.metrics import percentile
from libs.sim.traces import SimJob

MAX_TRIALS = 16  # replays per model at most (a binary search over up to 2^14 node counts fits)


@dataclass(frozen=True, slots=True)
class Trial:
    gpu_model: str
    nodes: int
    gpus: int
    jobs: int  # history jobs the model served
    unplaced: int  # of those, how many never started in the replay
    p90_wait_s: float  # math.inf when more than a tenth never started
    ok: bool

    def view(self) -> dict:
        return {"gpu_model": self.gpu_model, "nodes": self.nodes, "gpus": self.gpus, "jobs": self.jobs,
                "unplaced": self.unplaced,
                "p90_wait_s": None if math.isinf(self.p90_wait_s) else round(self.p90_wait_s, 3), "ok": self.ok}


def model_of(node: Node) -> str:
    counts = Counter(g.model for g in node.gpus)
    return counts.most_common(1)[0][0] if counts else ""


def scaled_pool(nodes: list[Node], gpu_model: str, n_nodes: int) -> list[Node]:
    """The pool with exactly `n_nodes` nodes of `gpu_model`: the first ones of the pool, then copies of its first
    node of that model (named `<node>+k`, GPUs renamed to match). Nodes of other models are kept as they are."""
    own = [n for n in nodes if model_of(n) == gpu_model]
    if not own:
        raise ValueError(f"the pool has no node of {gpu_model}")
    others = [n for n in nodes if model_of(n) != gpu_model]
    template = own[0]
    extra = []
    for k in range(max(0, n_nodes - len(own))):
        name = f"{template.name}+{k + 1}"
        gpus = tuple(dataclasses.replace(g, uuid=f"{name}/gpu{g.index}") for g in template.gpus)
        extra.append(dataclasses.replace(template, name=name, gpus=gpus))
    return others + own[:n_nodes] + extra


def replayable(jobs: list[SimJob]) -> list[SimJob]:
    """Jobs with a priority class the simulator's policy does not know keep their numeric priority instead (the
    platform's own classes may differ from the defaults)."""
    known = {c.name for c in DEFAULT_PRIORITY_CLASSES}
    out = []
    for j in jobs:
        r = j.request
        if r.priority_class and r.priority_class not in known:
            r = dataclasses.replace(r, priority_class="")
        out.append(SimJob(r, j.duration))
    return out


def p90_wait(result: engine.ReplayResult, job_ids: list[str]) -> tuple[float, int]:
    """(p90 wait of these jobs in the replay, how many never started); a job that never started waits forever."""
    waits = [result.waits.get(j, math.inf) for j in job_ids]
    unplaced = sum(1 for w in waits if math.isinf(w))
    return (percentile(waits, 90) if waits else 0.0), unplaced


def trial(nodes: list[Node], jobs: list[SimJob], served: dict[str, str], gpu_model: str, n_nodes: int,
          target_s: float, *, policy: str = "default", cycle_interval: float = 1.0) -> Trial:
    pool = scaled_pool(nodes, gpu_model, n_nodes)
    mine = [j.job_id for j in jobs if served.get(j.job_id) == gpu_model]
    result = engine.replay(pool, jobs, policy, cycle_interval=cycle_interval, frag_samples=10) if pool else None
    if result is None:
        p90, unplaced = (math.inf if mine else 0.0), len(mine)
    else:
        p90, unplaced = p90_wait(result, mine)
    gpus = sum(len(n.gpus) for n in pool if model_of(n) == gpu_model)
    return Trial(gpu_model, n_nodes, gpus, len(mine), unplaced, p90, p90 <= target_s)


def smallest_pool(nodes: list[Node], jobs: list[SimJob], served: dict[str, str], gpu_model: str, target_s: float,
                  *, max_nodes: int | None = None, policy: str = "default",
                  cycle_interval: float = 1.0) -> tuple[Trial | None, list[Trial]]:
    """The smallest number of `gpu_model` nodes (0 … max_nodes, default twice today's) whose replay keeps the p90
    wait of the jobs that model served at or under `target_s`, by binary search (wait falls as nodes are added),
    with every other model as it is. Returns (the answer, or None when even max_nodes does not, and every trial
    sorted by size)."""
    jobs = replayable(jobs)
    today = sum(1 for n in nodes if model_of(n) == gpu_model)
    hi = max_nodes if max_nodes is not None else max(2 * today, today + 1)
    tried: dict[int, Trial] = {}

    def run(n: int) -> Trial:
        if n not in tried:
            tried[n] = trial(nodes, jobs, served, gpu_model, n, target_s, policy=policy,
                             cycle_interval=cycle_interval)
        return tried[n]

    best = None
    if run(hi).ok:
        best, lo, top = hi, 0, hi  # invariant: `top` passes; everything below `lo` fails
        while lo < top and len(tried) < MAX_TRIALS:
            mid = (lo + top) // 2
            if run(mid).ok:
                top = best = mid
            else:
                lo = mid + 1
    trials = [tried[n] for n in sorted(tried)]
    return (tried[best] if best is not None else None), trials
