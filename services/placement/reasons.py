"""A cycle's pending reasons against the last cycle's: what `explain` shows is written only where it changed.

With thousands of jobs waiting, nearly all of them wait for the same reason, with the same facts, cycle after
cycle. The core hands a plan's unchanged reasons back as last plan's very objects (`libs.core.answers`, kept by
`cache.KeptScheduler`), so what reads them here knows an unchanged one by its identity.
`ReasonRows` keeps the (reason, message, facts JSON) this replica last wrote for each wanted job, and gives a cycle
only the rows that differ from them, for one statement; after a reset (a replica that did not lead a while: another
one may have written meanwhile) it gives them all.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from libs.core import JobRequest, Node, PendingReason
from libs.core.objmemo import ByObject
from libs.core.plan import ReasonFacts
from libs.core.reasons import NO_NODE_MATCHES_SELECTOR
from services.placement.domain import ShownReason, facts_json, split_unit

Written = tuple[str, str, "str | None"]  # (reason, message, facts JSON) as pending_jobs holds them


class ReasonRows:
    """What this replica wrote to `pending_jobs` (reason, message, facts) for each wanted job, as of the last
    committed cycle, and which rows a new cycle changes. A unit's row is remembered by its `PendingReason` object
    (the same one as last cycle's when the core found it unchanged, `libs.core.answers`), so an unchanged backlog costs a lookup
    per job, not a message and facts compared field by field."""

    def __init__(self) -> None:
        self.written: dict[str, Written] = {}
        self._rows = ByObject()  # each reason object of recent cycles -> (its job, its row)
        self.order: tuple[str, ...] = ()  # the last `rows`' jobs in the order the plan lists them

    def forget(self) -> None:
        """The store may hold other reasons than these (another replica led meanwhile): the next cycle writes all."""
        self.written = {}

    def rows(self, pending: Iterable[PendingReason], requests: Iterable[JobRequest], nodes: Iterable[Node] | None,
             extra: Mapping[str, tuple[str, str]] | None = None) -> dict[str, Written]:
        """Each wanted job's row as `explain` shows it: `domain.pending_reasons` with `domain.pending_facts` (a job
        of several units has its last unit's), then `extra`'s reasons (jobs backing off; no facts). Sets `order`:
        the plan's jobs, each once, in the order it lists them (`domain.queue_order`)."""
        pending = pending if isinstance(pending, tuple | list) else tuple(pending)
        shown = ShownReason(pending, requests, nodes)
        facts: dict[int, tuple[ReasonFacts, str]] = {}

        def row(r: PendingReason) -> tuple[str, Written]:
            f = facts.get(id(r.facts))
            if f is None:
                f = facts[id(r.facts)] = (r.facts, facts_json(r.facts))
            return split_unit(r.job_id)[0], (*shown(r), f[1])

        got = self._rows.of(pending, row)
        if shown.selecting:  # what these show depends on the cycle's requests and nodes: worked out again
            for i in [i for i, r in enumerate(pending) if r.reason == NO_NODE_MATCHES_SELECTOR]:
                got[i] = row(pending[i])
        out = dict(got)
        self.order = tuple(out)
        for job_id, (reason, message) in (extra or {}).items():
            row_now = out.get(job_id)
            out[job_id] = (reason, message, row_now[2] if row_now is not None else None)
        return out

    def changed(self, rows: Mapping[str, Written]) -> list[tuple[str, str, str, str | None]]:
        """The rows that differ from what was written: (job_id, reason, message, facts JSON)."""
        written = self.written
        return [(j, *v) for j, v in rows.items() if written.get(j) != v]

    def committed(self, rows: dict[str, Written]) -> None:
        """The cycle that wrote `rows`' changes committed: they are what the store holds."""
        self.written = rows


def same_reasons(now: tuple[PendingReason, ...], before: tuple[PendingReason, ...] | None) -> bool:
    """Whether two plans' pending reasons say the same: each job's reason and message, in the same order (what
    `codec.reasons_digest` covers), told by identity first (`libs.core.answers`)."""
    if before is None or len(now) != len(before):
        return False
    return all(a is b or (a.job_id, a.reason, a.message) == (b.job_id, b.reason, b.message)
               for a, b in zip(now, before, strict=True))
