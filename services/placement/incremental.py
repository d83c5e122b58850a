"""What placement keeps from one cycle to the next of what it reads, brought up to date with only what changed:
the wanted jobs, the live allocations and the pool (`WantedJobs`), and what a cycle derives from the pool's GPUs
(`PoolFacts`). Pure: the store's read (services/placement/store.py, `load_state`) feeds them."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from services.placement.domain import Row, offered_models


class WantedJobs:
    """Placement's copy of the wanted jobs (pending_jobs rows not yet satisfied), refreshed by each cycle's read
    with only what changed: the read returns whole rows only for changes at or above `horizon` — the xmin of the
    previous read's snapshot — with the keys of rows gone since and how many rows there are now. Every transaction
    below that xmin had ended before the previous read, so a row it last changed was read then (or earlier)
    exactly as it is now. Every row inserted or changed since comes back, so a copy that holds as many rows as the
    store says holds the same ones; one that does not (a removal it was not told of) is forgotten and read whole.
    Rows that did not change stay the same objects from cycle to cycle (what RequestBuilder relies on). The live
    allocations (`"allocation_id"`) and the nodes (`"key"`) are kept the same way."""

    def __init__(self, key: str = "job_id") -> None:
        self.key = key
        self.rows: dict[str, Row] = {}
        self.horizon = "0"
        self.changed = True
        self.merges = 0  # merges that returned rows, counted: a reader of `delta` knows whether it saw the last one
        # the last such merge's change: (rows it removed or replaced, rows it added or put in their place), or None
        # when it started from an empty copy (every row is new: a reader starts over)
        self.delta: tuple[list[Row], list[Row]] | None = None

    def forget(self) -> None:
        self.rows, self.horizon = {}, "0"

    def merge(self, changed: list[Row], gone: Iterable[str], count: int | None, xmin: str, *,
              ordered: bool = False) -> list[Row] | None:
        """The rows now (`ordered`: sorted by key, else new rows last), or None (and forget everything, so the next
        read is a full one) if the copy does not hold `count` rows (None: not counted this time)."""
        rows, key = self.rows, self.key
        size, fresh = len(rows), not rows
        removed: list[Row] = []
        for k in gone:
            old = rows.pop(k, None)
            if old is not None:
                removed.append(old)
        added = False
        for r in changed:
            k = r[key]
            old = rows.get(k)
            if old is None:
                added = True
            else:
                removed.append(old)
            rows[k] = r
        self.changed = bool(changed) or len(rows) != size  # whether this read changed the copy
        if count is not None and len(rows) != count:
            self.forget()
            return None
        if ordered and added:
            self.rows = rows = {k: rows[k] for k in sorted(rows)}
        self.horizon = xmin
        self.merges += 1
        self.delta = None if fresh else (removed, list(changed))
        return list(rows.values())


class PoolFacts:
    """What a cycle derives from the pool's GPU rows — the models each sharing mode offers (`offered_models`) and
    each GPU's model — worked out again only when the pool's read changed something (`WantedJobs.changed`)."""

    def __init__(self) -> None:
        self.offered: dict[str, set[str]] = {}
        self.models: dict[str, str] = {}  # empty until worked out (or while the pool has no GPU)

    def update(self, gpus: list[Row], changed: bool) -> None:
        if changed or not self.models:
            self.offered, self.models = offered_models(gpus), {g["uuid"]: g["model"] for g in gpus}


class LiveTally:
    """What a cycle derives from the live allocations, kept from cycle to cycle and brought up to date with only
    the copy's last change (`WantedJobs.delta`): the replicas each job holds, the allocations being preempted (the
    earliest deadline, the units their victims make room for), and the GPUs held per state, model and team for
    /metrics. Worked out whole again when it missed a change or the copy started over."""

    def __init__(self) -> None:
        self._seen = -1
        self._reset()

    def _reset(self) -> None:
        self.replicas: dict[str, dict[int, int]] = {}  # job -> replica -> its live allocations
        self.preempting: dict[str, Row] = {}  # allocation id -> row, for those with a preemption deadline
        self.states: dict[str, int] = {"running": 0, "preempting": 0}
        self.by_model: dict[str, int] = {}  # GPU model -> milli-GPUs held (shares by their share)
        self.by_team: dict[tuple[str, str], int] = {}  # (team, GPU model) -> milli-GPUs held

    def update(self, live: WantedJobs) -> None:
        if live.delta is None or live.merges != self._seen + 1:
            self._reset()
            removed, added = (), live.rows.values()
        else:
            removed, added = live.delta
        for r in removed:
            self._count(r, -1)
        for r in added:
            self._count(r, 1)
        self._seen = live.merges

    def _count(self, r: Row, sign: int) -> None:
        held = self.replicas.setdefault(r["job_id"], {})
        n = held.get(r["replica"], 0) + sign
        if n > 0:
            held[r["replica"]] = n
        else:
            held.pop(r["replica"], None)
            if not held:
                del self.replicas[r["job_id"]]
        state = "running"
        if r["preempt_deadline"] is not None:
            state = "preempting"
            if sign > 0:
                self.preempting[r["allocation_id"]] = r
            else:
                self.preempting.pop(r["allocation_id"], None)
        self.states[state] += sign
        gpus = sign * len(r["gpu_uuids"]) * r["share_milli"]
        model = r["gpu_model"] or ""
        _add(self.by_model, model, gpus)
        _add(self.by_team, (r["team"], model), gpus)

    def facts(self) -> tuple[dict[str, dict[int, int]], Any, set[str]]:
        """`domain.live_facts` of the live allocations: the replicas each job holds (as the keys of each job's
        replica -> allocations count), the earliest preemption deadline (None: none is being preempted) and the
        units whose victims are being preempted for them."""
        deadlines = [r["preempt_deadline"] for r in self.preempting.values()]
        return (self.replicas, min(deadlines) if deadlines else None,
                {r["preempted_by"] for r in self.preempting.values()})


def _add(totals: dict, key: Any, amount: int) -> None:
    total = totals.get(key, 0) + amount
    if total:
        totals[key] = total
    else:
        totals.pop(key, None)
