"""FGD's fragmentation measure on a snapshot (the live gauge) and per node (the simulator's meter)."""

from __future__ import annotations

import math

import pytest

from libs.core import Allocation, Gpu, Node, Snapshot, WorkloadShape, measure_fragmentation
from libs.core.frag import node_fragmented_milli, shape_weights


def node(name: str, n: int = 4, model: str = "H100", sharing: str = "exclusive", cluster: str = "c",
         cpu_milli: int = 0) -> Node:
    return Node(name, cluster, tuple(Gpu(f"{name}-g{i}", i, model, 81920, sharing=sharing) for i in range(n)),
                cpu_milli=cpu_milli)


WORKLOAD = (WorkloadShape(gpus=4, gpu_milli=1000, weight=1.0), WorkloadShape(gpus=1, gpu_milli=1000, weight=3.0))


def test_free_gpus_the_big_shape_cannot_use_count_by_its_probability() -> None:
    snap = Snapshot(nodes=(node("a"), node("b"), node("x", model="A100", cluster="d")),
                    running=(Allocation("j", "t", "a", ("a-g0",)),))
    rows = {(r.cluster, r.gpu_model): r for r in measure_fragmentation(snap, WORKLOAD)}
    a = rows[("c", "H100")]
    assert (a.gpus, a.free_gpus) == (8, 7.0)
    assert a.fragmented_gpus == pytest.approx(3 * 0.25)  # node a: 3 free GPUs lost to the 4-GPU quarter
    assert a.fragmented_share == pytest.approx(0.75 / 7)
    assert rows[("d", "A100")].fragmented_gpus == 0.0


def test_a_shape_pinned_to_another_model_or_short_of_cpu_loses_everything_free() -> None:
    pinned = (WorkloadShape(gpus=1, gpu_milli=1000, weight=1.0, gpu_models=("A100",)),)
    [row] = measure_fragmentation(Snapshot(nodes=(node("a"),)), pinned)
    assert (row.free_gpus, row.fragmented_gpus) == (4.0, 4.0)
    hungry = (WorkloadShape(gpus=1, gpu_milli=1000, weight=1.0, cpu_milli=8000),)
    snap = Snapshot(nodes=(node("a", cpu_milli=16000),),
                    running=(Allocation("j", "t", "a", ("a-g0",), cpu_milli=12000),))
    [row] = measure_fragmentation(snap, hungry)
    assert (row.free_gpus, row.fragmented_gpus) == (3.0, 3.0)


def test_fractions_use_partly_free_shareable_gpus_and_whole_shapes_do_not() -> None:
    frees = [("H100", "fractional", 600), ("H100", "fractional", 1000)]
    half = shape_weights([WorkloadShape(gpus=1, gpu_milli=500, weight=1.0)])
    assert node_fragmented_milli(frees, math.inf, math.inf, half) == 0.0
    whole = shape_weights([WorkloadShape(gpus=1, gpu_milli=1000, weight=1.0)])
    assert node_fragmented_milli(frees, math.inf, math.inf, whole) == 600.0  # the partly used GPU
    snap = Snapshot(nodes=(node("a", n=2, sharing="fractional"),),
                    running=(Allocation("j", "t", "a", ("a-g0",), gpu_fraction_milli=400, gpu_memory_mib=1024),))
    [row] = measure_fragmentation(snap, (WorkloadShape(gpus=2, gpu_milli=1000, weight=1.0),))
    assert (row.free_gpus, row.fragmented_gpus) == (pytest.approx(1.6), pytest.approx(1.6))


def test_nothing_to_measure_against_is_no_fragmentation() -> None:
    [row] = measure_fragmentation(Snapshot(nodes=(node("a"),)), ())
    assert (row.free_gpus, row.fragmented_gpus, row.fragmented_share) == (4.0, 0.0, 0.0)
