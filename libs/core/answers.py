"""The last cycle's answers, so that an unchanged one is the very same object again (`SameAnswers`).

With thousands of jobs waiting, nearly all of them wait for the same reason, with the same facts, cycle after
cycle. A `Scheduler` given a `SameAnswers` (kept by its caller from one cycle to the next, across schedulers)
answers a job whose reason, message and facts equal last cycle's with last cycle's `PendingReason`, and equal facts
with one `ReasonFacts` object from cycle to cycle. The plan is the same in value; making 10,000 new reasons each
cycle was a large part of a deep queue's cycle, and whatever reads the plan next (placement's rows for `explain`,
the recorded decision's encoding) knows an unchanged reason by its identity instead of comparing field by field.
"""

from __future__ import annotations

from collections.abc import Iterable

from libs.core.plan import PendingReason, ReasonFacts


class SameAnswers:
    def __init__(self) -> None:
        self.last: dict[str, PendingReason] = {}  # job -> its reason in the last cycle
        self._facts: dict[ReasonFacts, ReasonFacts] = {}  # the facts the last cycle used, each one object
        self._next: dict[ReasonFacts, ReasonFacts] = {}  # ... and this cycle's
        self._seen: dict[int, tuple[ReasonFacts, ReasonFacts]] = {}  # id -> (the object, keeping its id; canon)

    def same(self, r: PendingReason) -> PendingReason:
        """`r`, or last cycle's reason of its job when equal; its facts as the one object of equal facts."""
        f = r.facts
        hit = self._seen.get(id(f))
        if hit is None or hit[0] is not f:  # once per facts object: the core shares one among jobs answered alike
            canon = self._next.get(f) or self._facts.get(f) or f
            self._next[canon] = canon
            self._seen[id(f)] = hit = (f, canon)
        canon = hit[1]
        prev = self.last.get(r.job_id)
        if prev is not None and prev.facts is canon and prev.reason == r.reason and prev.message == r.message:
            return prev
        return r if canon is f else PendingReason(r.job_id, r.reason, r.message, canon)

    def turn(self, reasons: Iterable[PendingReason]) -> None:
        """The cycle is over: its reasons are the last ones."""
        self.last = {r.job_id: r for r in reasons}
        self._facts, self._next, self._seen = self._next, {}, {}
