"""The MIG catalogue against NVIDIA's MIG User Guide ("Supported MIG Profiles"), layout rules, and the layout
planner (only free slots, never a busy instance, always a valid layout)."""

from __future__ import annotations

from core_builders import FAST, node, snapshot
from hypothesis import given
from hypothesis import strategies as st

from libs.core import Allocation, MigInstance, plan_mig_layouts
from libs.core import mig as migcat

ALL = (0, 1, 2, 3, 4, 5, 6)
# profile -> (compute slices, memory slices, start slots), as `nvidia-smi mig -lgipp` lists them
EXPECTED = {
    "A100-40GB": {"1g.5gb": (1, 1, ALL), "1g.10gb": (1, 2, (0, 2, 4, 6)), "2g.10gb": (2, 2, (0, 2, 4)),
                  "3g.20gb": (3, 4, (0, 4)), "4g.20gb": (4, 4, (0,)), "7g.40gb": (7, 8, (0,))},
    "A100-80GB": {"1g.10gb": (1, 1, ALL), "1g.20gb": (1, 2, (0, 2, 4, 6)), "2g.20gb": (2, 2, (0, 2, 4)),
                  "3g.40gb": (3, 4, (0, 4)), "4g.40gb": (4, 4, (0,)), "7g.80gb": (7, 8, (0,))},
    "H100-80GB": {"1g.10gb": (1, 1, ALL), "1g.20gb": (1, 2, (0, 2, 4, 6)), "2g.20gb": (2, 2, (0, 2, 4)),
                  "3g.40gb": (3, 4, (0, 4)), "4g.40gb": (4, 4, (0,)), "7g.80gb": (7, 8, (0,))},
    "H200-141GB": {"1g.18gb": (1, 1, ALL), "1g.35gb": (1, 2, (0, 2, 4, 6)), "2g.35gb": (2, 2, (0, 2, 4)),
                   "3g.71gb": (3, 4, (0, 4)), "4g.71gb": (4, 4, (0,)), "7g.141gb": (7, 8, (0,))},
}


def test_catalogue_has_every_profile_with_its_slot_positions():
    for model, profiles in EXPECTED.items():
        table = migcat.profiles_for(model)
        assert set(table) == set(profiles), model
        for name, (compute, slots, starts) in profiles.items():
            p = table[name]
            assert (p.compute, p.slots, p.starts) == (compute, slots, starts), (model, name)
    assert migcat.profiles_for("NVIDIA H100") == migcat.profiles_for("H100-80GB")  # names as NVML reports them
    assert migcat.profiles_for("L40S") == {}


def test_layout_rules():
    ok = migcat.valid_layout
    assert ok("A100-40GB", [("4g.20gb", 0), ("3g.20gb", 4)])
    assert ok("H100-80GB", [("3g.40gb", 0), ("3g.40gb", 4)])
    assert ok("A100-40GB", [("1g.5gb", s) for s in ALL])  # seven 1g instances: every compute slice
    assert not ok("A100-40GB", [("3g.20gb", 0), ("3g.20gb", 4), ("1g.5gb", 6)])  # slot 6 is taken
    assert not ok("A100-40GB", [("1g.5gb", 7)])  # not a start slot
    assert not ok("H200-141GB", [("2g.35gb", 6)])
    assert not ok("A100-80GB", [("4g.40gb", 0), ("4g.40gb", 4)])  # 4g only at 0 (and 8 compute slices)
    assert not ok("H100-80GB", [("7g.80gb", 0), ("1g.10gb", 0)])
    assert not ok("H100-80GB", [("5g.50gb", 0)])


@st.composite
def mig_gpus(draw):
    """Up to three MIG nodes of two GPUs, each GPU with a valid layout of instances, some of them busy."""
    nodes, busy = [], []
    for n in range(draw(st.integers(1, 3))):
        model = draw(st.sampled_from(tuple(EXPECTED)))
        table = migcat.profiles_for(model)
        layouts = {}
        for g in range(2):
            layout: list[tuple[str, int]] = []
            for _ in range(draw(st.integers(0, 4))):
                name = draw(st.sampled_from(sorted(table)))
                start = draw(st.sampled_from(table[name].starts))
                if migcat.valid_layout(model, layout + [(name, start)]):
                    layout.append((name, start))
            layouts[g] = tuple(layout)
            for name, start in layout:
                if draw(st.booleans()):
                    busy.append(Allocation(f"j{len(busy)}", "t", f"m{n}",
                                           mig=((f"m{n}-gpu{g}", MigInstance(name, start)),)))
        nodes.append(node(f"m{n}", 2, model=model, sharing="mig", mig=layouts))
    return nodes, busy


@FAST
@given(cluster=mig_gpus(), demand=st.dictionaries(st.sampled_from(sorted({p for m in EXPECTED for p in EXPECTED[m]})),
                                                  st.integers(0, 6), max_size=5))
def test_layout_planner_only_uses_free_slots_and_always_proposes_valid_layouts(cluster, demand):
    nodes, busy = cluster
    snap = snapshot(nodes, running=busy)
    configured = {g.uuid: [(i.profile, i.start) for i in g.mig_instances] for n in nodes for g in n.gpus}
    models = {g.uuid: g.model for n in nodes for g in n.gpus}
    wanted = dict(demand)
    for change in plan_mig_layouts(snap, demand):
        assert change.destroy == ()  # never drains or removes anything, busy or idle
        created = [(i.profile, i.start) for i in change.create]
        model = models[change.gpu_uuid]
        used = 0
        for name, start in configured[change.gpu_uuid]:
            used |= migcat.profile(model, name).mask(start)
        for name, start in created:
            assert not used & migcat.profile(model, name).mask(start)  # only free slots
            used |= migcat.profile(model, name).mask(start)
            wanted[name] -= 1
        assert migcat.valid_layout(model, configured[change.gpu_uuid] + created)
    assert all(v >= 0 for v in wanted.values())  # never more instances than asked for
