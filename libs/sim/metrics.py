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
