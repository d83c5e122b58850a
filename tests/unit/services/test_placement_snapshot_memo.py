"""`SnapshotMemo.closed_gpus` (placement/domain.py) gives what `closed_gpus` gives, looking again only at changed
rows: a live allocation whose row is the one it was keeps the GPUs it closed, a changed pool looks at all again."""

from __future__ import annotations

from services.placement.domain import SnapshotMemo, closed_gpus


def gpu(uuid: str, sharing: str = "exclusive", draining: bool = False) -> dict:
    return {"uuid": uuid, "cluster": "c", "node": "n", "sharing": sharing, "draining": draining}


def held(uuid: str, share_milli: int = 1000, mig: str | None = None) -> dict:
    return {"gpu_uuids": [uuid], "share_milli": share_milli, "mig_profiles": [mig]}


def test_the_memo_answers_as_closed_gpus_over_changes() -> None:
    memo = SnapshotMemo()
    gpus = [gpu("a"), gpu("b", "fractional"), gpu("c", "mig"), gpu("d", draining=True)]
    whole, fraction, slice_ = held("a"), held("b", 500), held("c", 142, "1g.10gb")
    steps = [
        (gpus, [whole, fraction, slice_]),  # every share fits its GPU's mode: only the draining one is closed
        (list(gpus), [whole, fraction, slice_, held("a", 500)]),  # a fraction on an exclusive GPU: closed
        (list(gpus), [whole, slice_]),  # it left, and so did the fraction
        ([gpu("a", "mig"), *gpus[1:]], [whole, slice_]),  # a's mode changed under its whole holder
        ([gpu("a", "mig"), *gpus[1:]], [whole, slice_, held("b")]),  # a whole GPU on a fractional one is fine
    ]
    seen = []
    for gs, running in steps:
        got = memo.closed_gpus(gs, running)
        assert got == closed_gpus(gs, running)
        seen.append(got)
    assert seen == [{"d"}, {"a", "d"}, {"d"}, {"a", "d"}, {"a", "d"}]


def test_a_kept_memo_builds_the_snapshot_built_afresh_cycle_after_cycle() -> None:
    """Rows that stay the same objects are reused (the nodes whole while no node, GPU or closed GPU changed); a
    changed row, a changed mode or a GPU newly closed is seen: the snapshot equals one built without a memo."""
    import random
    from datetime import UTC, datetime

    from services.placement.domain import build_snapshot

    rng = random.Random(11)
    t0 = datetime(2026, 12, 1, tzinfo=UTC)

    def gpu_row(n: int, i: int, sharing: str = "exclusive") -> dict:
        return {"uuid": f"n{n}-g{i}", "cluster": "c", "node": f"n{n}", "idx": i, "model": "H100", "memory_mib": 81920,
                "health": "healthy", "sharing": sharing, "draining": False}

    def node_row(n: int, gpus: list[dict]) -> dict:
        return {"cluster": "c", "node": f"n{n}", "schedulable": True, "labels": {}, "gpus": gpus}

    def live_row(k: int, n: int, i: int, share: int) -> dict:
        return {"allocation_id": f"a{k}", "job_id": f"j{k}", "replica": 0, "replicas": 1, "team": "t",
                "project": "p", "node": f"n{n}", "granted_at": t0, "priority": 0, "priority_class": "normal",
                "kind": "batch", "preempt_deadline": None, "max_runtime_s": None, "gpu_uuids": [f"n{n}-g{i}"],
                "gpu_model": "H100", "share_milli": share, "gpu_memory_mib": None, "mig_profiles": [None],
                "mig_starts": [None], "cpu_milli": 0, "memory_mib": 0, "preemptible": None}

    pool = {n: node_row(n, [gpu_row(n, i) for i in range(4)]) for n in range(6)}
    live: dict[str, dict] = {}
    memo, k = SnapshotMemo(), 0
    for _ in range(60):
        roll = rng.random()
        if roll < 0.15:  # a GPU's mode changes: its node's row comes back whole, new objects
            n, i = rng.randrange(6), rng.randrange(4)
            gs = [dict(g) for g in pool[n]["gpus"]]
            gs[i]["sharing"] = rng.choice(("exclusive", "fractional"))
            pool[n] = node_row(n, gs)
        elif roll < 0.6:
            k += 1
            live[f"a{k}"] = live_row(k, rng.randrange(6), rng.randrange(4), rng.choice((1000, 500)))
        elif live:
            live.pop(rng.choice(sorted(live)))
        nodes = list(pool.values())
        gpus = [g for n in nodes for g in n["gpus"]]
        running = list(live.values())
        assert build_snapshot(nodes, gpus, running, (), memo) == build_snapshot(nodes, gpus, running)
