"""MIG layout planner: from pending demand per profile, propose instances to create in free slots.

Never touches an instance that is in use: busy instances stay where they are, idle configured instances are kept
(and count towards the demand they can serve). Partly used GPUs are filled before empty ones, so whole GPUs stay
free for large profiles and exclusive work. Every proposed layout is valid (`mig.valid_layout`).
"""

from __future__ import annotations

from libs.core import mig as migcat
from libs.core.model import MIG, MigInstance, Snapshot
from libs.core.plan import MigReconfig


def plan_mig_layouts(snapshot: Snapshot, demand: dict[str, int]) -> tuple[MigReconfig, ...]:
    """`demand`: profile name -> instances wanted (e.g. counted from pending MIG requests)."""
    busy: dict[str, list[tuple[str, int]]] = {}
    for a in snapshot.running:
        for uuid, inst in a.mig:
            busy.setdefault(uuid, []).append((inst.profile, inst.start))
    remaining = {k: v for k, v in demand.items() if v > 0}
    gpus = []
    for node in sorted(snapshot.nodes, key=lambda n: (n.cluster, n.name)):
        if not node.schedulable:
            continue
        for g in sorted(node.gpus, key=lambda g: g.index):
            if g.sharing != MIG or not g.healthy or not migcat.profiles_for(g.model):
                continue
            if g.uuid in snapshot.allocated_gpus:
                continue
            held = busy.get(g.uuid, [])
            held_set = set(held)
            idle = [(i.profile, i.start) for i in g.mig_instances if (i.profile, i.start) not in held_set]
            for name, _ in idle:  # idle instances already serve demand
                if remaining.get(name, 0) > 0:
                    remaining[name] -= 1
            gpus.append((0 if held else 1, node.name, g.index, g, held + idle))
    out: list[MigReconfig] = []
    for _, node_name, _, g, kept in sorted(gpus, key=lambda x: (x[0], x[1], x[2])):
        table = migcat.profiles_for(g.model)
        wanted: list[str] = []
        for name, n in sorted(remaining.items()):
            if name in table:
                wanted.extend([name] * n)
        if not wanted:
            continue
        created = migcat.plan_gpu_layout(g.model, kept, wanted)
        if not created:
            continue
        for name, _ in created:
            remaining[name] -= 1
        out.append(MigReconfig(node_name, g.uuid, (), tuple(MigInstance(n, s) for n, s in created)))
    return tuple(out)
