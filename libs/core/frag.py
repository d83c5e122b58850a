"""Fragmentation as FGD measures it (Weng et al., ATC'23): the free GPU capacity that a request drawn from the
workload could not use. One definition for the simulator's meter and the live platform's gauge.

A node's free GPUs are lost to a shape when the shape cannot be placed there at all (not enough free host CPU or
memory, too few wholly free GPUs of its models, no shareable GPU with room for its fraction); when it can, the free
capacity it could not use (partly free GPUs for a whole-GPU shape, GPUs too full or of other models for a fraction)
is lost. The node's fragmentation is the expectation over the workload's shapes, weighted by how often each occurs.
MIG GPUs and unhealthy GPUs are left out (MIG slices are measured by their own scorer).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from libs.core.model import EXCLUSIVE, MIG, WHOLE, Snapshot
from libs.core.policy import WorkloadShape


@dataclass(frozen=True, slots=True)
class FragmentationRow:
    """One cluster's GPUs of one model: how many, how many are free (in GPUs, a fraction counts its free share) and
    how many of those free GPUs the workload is expected not to be able to use."""

    cluster: str
    gpu_model: str
    gpus: int
    free_gpus: float
    fragmented_gpus: float

    @property
    def fragmented_share(self) -> float:
        """Of the free capacity, the part no shape of the workload could use (0 when nothing is free)."""
        return self.fragmented_gpus / self.free_gpus if self.free_gpus > 0 else 0.0


def mix_probabilities(workload: Iterable[WorkloadShape]) -> tuple[list[tuple[float, WorkloadShape]], float]:
    """What the scheduler's fragmentation score weighs: the GPU shapes (MIG left out: the MIG scorer handles
    them) each with its probability, and the probability of a GPU-less request. Weights that sum to more than 1
    are counts and are normalised; otherwise they are probabilities already (`workload_from_counts`), and what
    they leave out is work outside the typical requests, which counts for nothing."""
    work = [w for w in workload if not w.mig_profile]
    total = sum(w.weight for w in work)
    scale = total if total > 1.0 + 1e-9 else 1.0
    gpuless = sum(w.weight for w in work if w.gpus <= 0) / scale
    return [(w.weight / scale, w) for w in work if w.gpus > 0], gpuless


def shape_weights(workload: Iterable[WorkloadShape]) -> list[tuple[float, WorkloadShape]]:
    """The GPU shapes of the workload (MIG and GPU-less shapes left out), each with its probability among them:
    the gauge and the simulator's meter ask what a GPU request could not use."""
    shapes = [w for w in workload if w.gpus > 0 and not w.mig_profile]
    total = sum(w.weight for w in shapes) or 1.0
    return [(w.weight / total, w) for w in shapes]


def node_fragmented_milli(frees: Sequence[tuple[str, str, int]], cpu_free: float, mem_free: float,
                          shapes: Sequence[tuple[float, WorkloadShape]]) -> float:
    """Expected milli-GPUs of one node that a request drawn from `shapes` could not use. `frees`: (model, sharing,
    free milli-GPUs) of each healthy non-MIG GPU; `cpu_free` / `mem_free`: free host milli-cores / MiB (inf where
    the node does not track them)."""
    total = sum(f for _, _, f in frees)
    if total <= 0:
        return 0.0
    out = 0.0
    for p, w in shapes:
        if w.cpu_milli > cpu_free or w.memory_mib > mem_free:
            out += p * total
            continue
        models = set(w.gpu_models) or None
        if w.gpu_milli < WHOLE:
            ok = [f for model, sharing, f in frees
                  if f >= w.gpu_milli and sharing != EXCLUSIVE and (models is None or model in models)]
            out += p * (total - sum(ok) if ok else total)
        else:
            full = [f for model, _, f in frees if f == WHOLE and (models is None or model in models)]
            out += p * (total - sum(full) if len(full) >= w.gpus else total)
    return out


def measure_fragmentation(snapshot: Snapshot, workload: Iterable[WorkloadShape]) -> tuple[FragmentationRow, ...]:
    """FGD's measure on a live snapshot, per cluster and GPU model, over schedulable nodes. A node with GPUs of
    several models attributes its fragmented capacity to each model in proportion to that model's free share."""
    shapes = shape_weights(workload)
    held: dict[str, int] = {}
    cpu_used: dict[str, int] = {}
    mem_used: dict[str, int] = {}
    for a in snapshot.running:
        per_gpu = a.gpu_fraction_milli or WHOLE
        for uuid in a.gpu_uuids:
            held[uuid] = held.get(uuid, 0) + per_gpu
        cpu_used[a.node] = cpu_used.get(a.node, 0) + a.cpu_milli
        mem_used[a.node] = mem_used.get(a.node, 0) + a.memory_mib
    rows: dict[tuple[str, str], list[float]] = {}
    for node in snapshot.nodes:
        frees: list[tuple[str, str, int]] = []
        for g in node.gpus:
            row = rows.setdefault((node.cluster, g.model), [0, 0.0, 0.0])
            row[0] += 1
            if g.sharing == MIG or not g.healthy or not node.schedulable:
                continue
            taken = WHOLE if g.uuid in snapshot.allocated_gpus else held.get(g.uuid, 0)
            frees.append((g.model, g.sharing, max(0, WHOLE - taken)))
        cpu_free = node.cpu_milli - cpu_used.get(node.name, 0) if node.cpu_milli else math.inf
        mem_free = node.memory_mib - mem_used.get(node.name, 0) if node.memory_mib else math.inf
        lost = node_fragmented_milli(frees, cpu_free, mem_free, shapes) if shapes else 0.0
        total = sum(f for _, _, f in frees)
        for model, _, f in frees:
            row = rows[(node.cluster, model)]
            row[1] += f / WHOLE
            row[2] += lost * f / total / WHOLE if total else 0.0
    return tuple(FragmentationRow(cluster, model, int(n), free, frag)
                 for (cluster, model), (n, free, frag) in sorted(rows.items()))
