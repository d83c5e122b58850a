"""Admission back-pressure: how many jobs wait for placement, and how fast placement has been granting them, kept
cheaply enough to ask on every submission. The decision itself is `domain.backlog_refusal`."""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Awaitable, Callable

from libs.domain import Refusal
from services.queue.config import QueueSettings
from services.queue.domain import backlog_refusal, grant_rate


class Backlog:
    """The backlog as last counted (`count(cap, window_s)`, at most every `backlog_refresh_s`) plus the jobs admitted
    since; the grant rate from the jobs every replica granted in the window as of that count, or from this
    instance's own recent grants when those say more (they are seen at once). Between counts a grant is not
    subtracted: the estimate errs towards refusing, never towards a queue longer than the limit. A submission
    reserves its place before asking quota (`reserve`), then either takes it (`admitted`: the job is stored pending)
    or gives it back (`release`), so the submissions of a burst in flight together cannot all pass the same check.

    With N queue replicas each consumes about 1/N of the grants: a rate from its own alone made Retry-After N times
    too long."""

    def __init__(self, settings: QueueSettings, count: Callable[[int, float], Awaitable[tuple[int, int]]],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.settings, self._count, self._clock = settings, count, clock
        self.waiting = 0  # pending jobs: the last count and those admitted since
        self.reserved = 0  # submissions between their check and their commit
        self.granted_in_window = 0  # jobs every replica granted in the window before the last count
        self._counted_at: float | None = None
        self._grants: deque[float] = deque()
        self._lock = asyncio.Lock()

    async def reserve(self) -> Refusal | None:
        """Take a place in the queue, or the 429 refusal when it is full (no limit: always a place)."""
        limit = self.settings.max_backlog
        if limit <= 0:
            return None
        await self._recount(limit)
        now = self._clock()
        self._forget_grants(now)
        window = self.settings.grant_rate_window_s
        rate = max(grant_rate(self._grants, now=now, window_s=window), self.granted_in_window / window)
        refusal = backlog_refusal(self.waiting + self.reserved, limit, rate, ceiling_s=self.settings.retry_after_max_s)
        if refusal is None:
            self.reserved += 1
        return refusal

    def admitted(self) -> None:
        """The reserved place is taken: the job is stored, waiting for placement."""
        if self.settings.max_backlog > 0:
            self.reserved = max(0, self.reserved - 1)
            self.waiting += 1

    def release(self) -> None:
        """A reserved place not taken after all (admission refused, awaiting approval, a lost idempotency race)."""
        if self.settings.max_backlog > 0:
            self.reserved = max(0, self.reserved - 1)

    def granted(self) -> None:
        """A job left `pending` for its GPUs: counted towards the recent grant rate."""
        now = self._clock()
        self._grants.append(now)
        self._forget_grants(now)

    def _forget_grants(self, now: float) -> None:
        while self._grants and now - self._grants[0] > self.settings.grant_rate_window_s:
            self._grants.popleft()

    async def _recount(self, limit: int) -> None:
        if self._fresh():
            return
        async with self._lock:  # one count in flight; the others use its answer
            if self._fresh():
                return
            self.waiting, self.granted_in_window = await self._count(limit + 1, self.settings.grant_rate_window_s)
            self._counted_at = self._clock()

    def _fresh(self) -> bool:
        return self._counted_at is not None and self._clock() - self._counted_at < self.settings.backlog_refresh_s
