"""Measures for simulator runs: percentiles, Jain fairness, fragmentation of a ledger against a workload."""

from __future__ import annotations

import math
from collections.abc import Sequence

from libs.core.frag import node_fragmented_milli, shape_weights
from libs.core.model import MIG, WHOLE
from libs.core.policy import WorkloadShape
from libs.sim.applier import Ledger


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100); 0.0 for no values."""
    if not values:
        return 0.0
    s = sorted(values)
    k = max(0, min(len(s) - 1, math.ceil(q / 100 * len(s)) - 1))
    return float(s[k])


def mean(values: Sequence[float]) -> float:
    return float(sum(values) / len(values)) if values else 0.0


def jain(values: Sequence[float]) -> float:
    """Jain's fairness index: 1 when all equal, 1/n when one gets everything."""
    vals = [v for v in values if v >= 0]
    if not vals or sum(vals) == 0:
        return 1.0
    return sum(vals) ** 2 / (len(vals) * sum(v * v for v in vals))


class FragMeter:
    """Expected free GPUs that a request drawn from the workload could not use (FGD's measure, the core's one
    definition in `libs.core.frag`), on a ledger."""

    def __init__(self, ledger: Ledger, workload: Sequence[WorkloadShape]):
        self.ledger = ledger
        self.shapes = shape_weights(workload)
        self.by_node: dict[str, list] = {}
        for g in ledger.gpus.values():
            if g.sharing != MIG and g.healthy:
                self.by_node.setdefault(g.node, []).append(g)

    def fragmented_gpus(self) -> float:
        out = 0.0
        for name, gpus in self.by_node.items():
            node = self.ledger.nodes[name]
            if not node.schedulable:
                continue
            frees = [(g.model, g.sharing, WHOLE - g.used_milli if g.whole_holder is None else 0) for g in gpus]
            cpu_free = node.cpu_cap - node.cpu_used if node.cpu_cap else math.inf
            mem_free = node.mem_cap - node.mem_used if node.mem_cap else math.inf
            out += node_fragmented_milli(frees, cpu_free, mem_free, self.shapes)
        return out / WHOLE


class ShareWindows:
    """Each team's GPU time against its entitlement, per window of replay time.

    A team's entitlement at an instant is its guarantee (in GPUs) or, when it wants less, its demand: the GPUs of
    its jobs that have arrived and not finished (waiting or running). Both that and what the team holds are step
    functions of time, integrated here over windows of `window_s`; `summary()` gives, over every (window, team)
    where the team was entitled to something, the ratio of what it got to what it was entitled to (capped at 1:
    using more than one's entitlement, by borrowing, is no fairness gain)."""

    def __init__(self, guarantees: dict[str, float], window_s: float, t0: float):
        if window_s <= 0:
            raise ValueError("the fairness window must be positive")
        self.guarantee = dict(guarantees)  # team -> GPUs
        self.window_s = window_s
        self.t0 = t0
        self.last = t0
        self.held: dict[str, float] = dict.fromkeys(guarantees, 0.0)  # team -> GPUs held now
        self.wants: dict[str, float] = dict.fromkeys(guarantees, 0.0)  # team -> GPUs arrived and not finished
        self.acc: dict[int, dict[str, list[float]]] = {}  # window -> team -> [GPU-s got, GPU-s entitled]

    def change(self, t: float, team: str, held: float = 0.0, wants: float = 0.0) -> None:
        """At `t`, the team holds `held` more GPUs and wants `wants` more (negative: fewer)."""
        self.advance(t)
        self.held[team] = self.held.get(team, 0.0) + held
        self.wants[team] = self.wants.get(team, 0.0) + wants

    def advance(self, t: float) -> None:
        while self.last < t:
            w = int((self.last - self.t0) // self.window_s)
            end = min(t, self.t0 + (w + 1) * self.window_s)
            dt = end - self.last
            if dt <= 0:  # float rounding at a window's edge
                end, w = t, w + 1
                dt = end - self.last
            row = self.acc.setdefault(w, {})
            for team, wants in self.wants.items():
                ent = min(self.guarantee.get(team, 0.0), max(0.0, wants))
                held = self.held.get(team, 0.0)
                if ent <= 0 and held <= 0:
                    continue
                cell = row.setdefault(team, [0.0, 0.0])
                cell[0] += held * dt
                cell[1] += ent * dt
            self.last = end

    def summary(self, low: float = 0.8, min_entitled_gpu_s: float = 60.0) -> dict:
        """mean and worst ratio over (window, team), the share of them below `low`, and the same per team; a
        (window, team) counts only where the team was entitled to at least `min_entitled_gpu_s` GPU-seconds."""
        per_team: dict[str, list[float]] = {}
        for w in sorted(self.acc):
            for team, (got, ent) in sorted(self.acc[w].items()):
                if ent >= min_entitled_gpu_s:
                    per_team.setdefault(team, []).append(max(0.0, min(1.0, got / ent)))  # float dust below 0
        every = [r for rs in per_team.values() for r in rs]

        def digest(rs: list[float]) -> dict:
            return {"windows": len(rs), "mean_ratio": round(mean(rs), 6), "worst_ratio": round(min(rs, default=1.0), 6),
                    "share_below": round(sum(1 for r in rs if r < low) / len(rs), 6) if rs else 0.0}

        return {"window_s": self.window_s, "below": low, **digest(every),
                "teams": {t: digest(rs) for t, rs in sorted(per_team.items())}}
