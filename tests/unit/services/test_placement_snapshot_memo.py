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
