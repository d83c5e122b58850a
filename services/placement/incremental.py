"""What placement keeps from one cycle to the next of what it reads, brought up to date with only what changed:
the wanted jobs, the live allocations and the pool (`WantedJobs`), and what a cycle derives from the pool's GPUs
(`PoolFacts`). Pure: the store's read (services/placement/store.py, `load_state`) feeds them."""

from __future__ import annotations

from collections.abc import Iterable

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

    def forget(self) -> None:
        self.rows, self.horizon = {}, "0"

    def merge(self, changed: list[Row], gone: Iterable[str], count: int, xmin: str, *,
              ordered: bool = False) -> list[Row] | None:
        """The rows now (`ordered`: sorted by key, else new rows last), or None (and forget everything, so the next
        read is a full one) if the copy does not hold `count` rows."""
        rows, key = self.rows, self.key
        size = len(rows)
        for k in gone:
            rows.pop(k, None)
        added = False
        for r in changed:
            k = r[key]
            added = added or k not in rows
            rows[k] = r
        self.changed = bool(changed) or len(rows) != size  # whether this read changed the copy
        if len(rows) != count:
            self.forget()
            return None
        if ordered and added:
            self.rows = rows = {k: rows[k] for k in sorted(rows)}
        self.horizon = xmin
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
