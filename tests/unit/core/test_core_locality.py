"""Locality inside a node (which GPUs: one NVLink domain, then one NUMA node, then the fewest NUMA nodes) and
across nodes (a gang in one rack, then one block), and what a waiting gang's reason says of its rack."""

from __future__ import annotations

from core_builders import job, node, running, snapshot

from libs.core import Gpu, Node, Policy, schedule
from libs.core.fit import choose, normalize
from libs.core.state import ClusterState


def _node(name: str, numa: list[int], nvlink: list[str] | None = None, model: str = "L40S") -> Node:
    return Node(name, "c1", tuple(Gpu(f"{name}-gpu{i}", i, model, 46068, numa_node=n,
                                      nvlink_domain=(nvlink or [""] * len(numa))[i]) for i, n in enumerate(numa)))


def _pick(n: Node, busy: list[int], gpus: int, **kw) -> tuple[int, ...]:
    """The GPUs a `gpus`-GPU job gets on `n` while `busy` are held, through the whole scheduler."""
    snap = snapshot([n], running=[running("r", n.name, busy)] if busy else [])
    plan = schedule(snap, [job("j", gpus, **kw)], Policy(), now=0.0)
    (p,) = plan.placements
    return p.gpu_indices


def test_a_pair_stays_on_one_numa_node_when_index_order_would_cross_it():
    # the node: GPUs 2,3 share a NUMA node; GPU 0 is busy; index order would give 1,2 (two NUMA nodes)
    assert _pick(_node("p", [0, 0, 1, 1]), [0], 2) == (2, 3)


def test_inside_an_nvswitch_domain_the_gpus_still_keep_to_one_numa_node():
    nvswitch = _node("h", [0, 0, 0, 0, 1, 1, 1, 1], ["nv0"] * 8, model="H100-80GB")
    assert _pick(nvswitch, [0, 1, 2], 2) == (4, 5)
    assert _pick(nvswitch, [0, 1, 2], 1) == (3,)  # one GPU: the first free, as before


def test_an_nvlink_pair_comes_before_a_numa_node():
    pairs = _node("h", [0, 0, 0, 0, 1, 1, 1, 1], ["nv0", "nv0", "nv2", "nv2", "nv4", "nv4", "nv6", "nv6"],
                  model="H100-80GB")
    assert _pick(pairs, [0], 2) == (2, 3)  # 1 and 2 share the NUMA node but no NVLink
    assert _pick(pairs, [0, 3], 2) == (4, 5)
    assert _pick(pairs, [0, 2, 4, 6], 2) == (1, 3)  # no pair left: one NUMA node


def test_without_room_on_one_numa_node_the_gpus_span_as_few_as_possible():
    four = _node("q", [0, 0, 1, 1, 2, 2, 3, 3])
    assert _pick(four, [0, 2, 4], 3) == (1, 6, 7)  # index order: 1, 3, 5 on three NUMA nodes


def test_without_numa_or_nvlink_facts_the_pick_is_index_order_as_before():
    assert _pick(_node("x", [0, 0, 0, 0]), [0], 2) == (1, 2)
    assert _pick(_node("y", [-1, -1, -1, -1]), [0], 2) == (1, 2)  # NUMA node unknown to the agent


def test_a_job_that_does_not_prefer_nvlink_gets_index_order():
    assert _pick(_node("p", [0, 0, 1, 1]), [0], 2, prefer_nvlink=False) == (1, 2)


def test_choose_is_deterministic_and_scores_its_locality():
    st = ClusterState(snapshot([_node("p", [0, 1, 0, 1, 0, 1])]))
    cls = st.classes[st.nodes[0].cls]
    dyn = (0, 1000, 1000, 1000, 1000, 1000)
    allowed = frozenset({"L40S"})
    shape = normalize(job("j", 2))
    picks = {choose(cls, dyn, shape, 2, allowed, mode) for mode in ("first", "tight", "frag") for _ in range(3)}
    assert {(c[0].positions, c[0].topology) for c in picks} == {((2, 4), 0.75)}
    (spread,) = choose(cls, dyn, normalize(job("k", 4)), 4, allowed, "first")
    assert spread.positions == (1, 2, 3, 5) and spread.topology == 0.5  # all of NUMA node 1, one of 0


def test_a_gang_goes_to_the_rack_that_can_hold_all_of_it():
    # the best node for the first member (a0, lowest index) is alone in its rack: the gang goes to rack-b whole
    nodes = [node("a0", 8, topology="rack-a"), node("b0", 8, topology="rack-b"), node("b1", 8, topology="rack-b")]
    plan = schedule(snapshot(nodes), [job("g", 16, gang_nodes=2, gpus_per_node=8)], Policy(), now=0.0)
    assert sorted(p.node for p in plan.placements) == ["b0", "b1"]


def test_without_a_rack_that_holds_the_gang_it_still_runs_across_racks():
    nodes = [node("a0", 8, topology="rack-a"), node("b0", 8, topology="rack-b"), node("c0", 8, topology="rack-c")]
    plan = schedule(snapshot(nodes), [job("g", 16, gang_nodes=2, gpus_per_node=8)], Policy(), now=0.0)
    assert len({p.node for p in plan.placements}) == 2


def test_a_gang_that_fits_no_rack_stays_in_one_block():
    nodes = [node("a", 8, topology="b1/r1"), node("b", 8, topology="b2/r2"), node("c", 8, topology="b2/r3"),
             node("d", 8, topology="b1/r4")]
    plan = schedule(snapshot(nodes), [job("g", 16, gang_nodes=2, gpus_per_node=8)], Policy(), now=0.0)
    assert sorted(p.node for p in plan.placements) == ["a", "d"]


def test_a_waiting_gang_names_the_rack_closest_to_holding_it():
    nodes = [node("a0", 4, topology="r1"), node("a1", 4, topology="r1"), node("b0", 4, topology="r2"),
             node("b1", 4, topology="r2")]
    snap = snapshot(nodes, running=[running("x", "a0", [0]), running("y", "b0", [0]), running("z", "b1", [0])])
    plan = schedule(snap, [job("g", 12, gang_nodes=3, gpus_per_node=4)], Policy(), now=0.0)
    why = plan.reason_of("g")
    assert why.reason == "WaitingForGang"
    assert "waiting for 3 node(s) in one rack: rack r1 has 1" in why.message
