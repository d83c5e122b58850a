"""Admission back-pressure: the pure rule (a full queue refuses with 429 and a Retry-After derived from the recent
grant rate), the backlog estimate the queue keeps between counts, and the submission handler on the fake runtime
(refused before quota is asked; room again once grants drain the backlog)."""

from __future__ import annotations

import pytest
from test_queue_handlers import FakeQueueStore, granted, submit

from libs.contracts import subjects
from libs.contracts.commands import AdmitJob, Reply
from libs.runtime.fake import FakeRuntime
from services.queue import handlers
from services.queue.backlog import Backlog
from services.queue.config import QueueSettings
from services.queue.domain import backlog_refusal, grant_rate, retry_after_s
from services.queue.handlers import QueueHandlers, routes


# --- the rule ---------------------------------------------------------------------------------------------------------
def test_the_grant_rate_counts_only_the_window() -> None:
    assert grant_rate([1.0, 50.0, 95.0, 99.0, 100.0], now=100.0, window_s=10.0) == pytest.approx(0.3)
    assert grant_rate([], now=100.0, window_s=10.0) == 0.0
    assert grant_rate([101.0], now=100.0, window_s=10.0) == 0.0  # not yet


def test_retry_after_is_the_time_to_grant_the_excess_within_bounds() -> None:
    assert retry_after_s(1, 90.0, ceiling_s=300) == 1  # never 0
    assert retry_after_s(450, 90.0, ceiling_s=300) == 5
    assert retry_after_s(451, 90.0, ceiling_s=300) == 6  # rounded up
    assert retry_after_s(10, 0.05, ceiling_s=120) == 120  # 200 s, capped
    assert retry_after_s(3, 0.0, ceiling_s=300) == 300  # nothing granted lately: the longest wait


def test_below_the_limit_or_without_one_a_job_is_admitted() -> None:
    assert backlog_refusal(99, 100, 5.0, ceiling_s=300) is None
    assert backlog_refusal(10**6, 0, 0.0, ceiling_s=300) is None  # 0: no limit


def test_a_full_queue_refuses_with_429_naming_the_backlog_limit_and_wait() -> None:
    refusal = backlog_refusal(120, 100, 3.0, ceiling_s=300)
    assert refusal is not None and (refusal.status, refusal.reason) == (429, "QueueFull")
    assert refusal.details == {"backlog": 120, "max_backlog": 100, "grants_per_s": 3.0, "retry_after_s": 7}
    assert "120 jobs are waiting" in refusal.message and "at most 100" in refusal.message
    assert "retry in 7 s" in refusal.message
    exactly_full = backlog_refusal(100, 100, 3.0, ceiling_s=300)
    assert exactly_full is not None and exactly_full.details["retry_after_s"] == 1
    stuck = backlog_refusal(100, 100, 0.0, ceiling_s=60)
    assert stuck is not None and stuck.details["retry_after_s"] == 60 and "no job granted lately" in stuck.message


# --- the estimate -----------------------------------------------------------------------------------------------------
class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def test_the_backlog_is_recounted_only_when_stale_and_reservations_hold_places() -> None:
    counts: list[int] = []
    in_db = {"pending": 2}

    async def count(cap: int, window_s: float) -> tuple[int, int]:
        counts.append(cap)
        return min(cap, in_db["pending"]), 0

    clock = Clock()
    backlog = Backlog(QueueSettings(max_backlog=3, backlog_refresh_s=1.0), count, clock)
    assert await backlog.reserve() is None and counts == [4]  # counted once, up to limit + 1
    full = await backlog.reserve()  # 2 waiting + 1 in flight: full
    assert full is not None and full.details["backlog"] == 3 and counts == [4]
    backlog.release()  # the first one was refused by quota after all
    assert await backlog.reserve() is None
    backlog.admitted()
    assert backlog.waiting == 3 and backlog.reserved == 0
    in_db["pending"] = 0  # placement granted them all; not seen until the next count
    assert await backlog.reserve() is not None
    clock.now += 1.5
    assert await backlog.reserve() is None and counts == [4, 4]


async def test_retry_after_follows_the_grants_seen_in_the_window() -> None:
    async def count(cap: int, window_s: float) -> tuple[int, int]:
        return 5, 0

    clock = Clock()
    backlog = Backlog(QueueSettings(max_backlog=5, grant_rate_window_s=10.0, retry_after_max_s=100), count, clock)
    for _ in range(20):  # 2 grants per second over the window
        backlog.granted()
    refusal = await backlog.reserve()
    assert refusal is not None and refusal.details["grants_per_s"] == 2.0 and refusal.details["retry_after_s"] == 1
    clock.now += 11  # the grants left the window: nothing granted lately
    refusal = await backlog.reserve()
    assert refusal is not None and refusal.details["retry_after_s"] == 100


async def test_retry_after_counts_the_grants_of_every_replica() -> None:
    """Two queue replicas share the grants: this one consumed 5 of the 20 granted in the window, the database
    counts all 20, and Retry-After is the time to grant the excess at the fleet's rate, not at a quarter of it."""
    windows: list[float] = []
    in_db = {"granted": 20}

    async def count(cap: int, window_s: float) -> tuple[int, int]:
        windows.append(window_s)
        return 6, in_db["granted"]

    clock = Clock()
    settings = QueueSettings(max_backlog=5, grant_rate_window_s=10.0, retry_after_max_s=100, backlog_refresh_s=1.0)
    backlog = Backlog(settings, count, clock)
    for _ in range(5):
        backlog.granted()
    refusal = await backlog.reserve()
    assert windows == [10.0]
    assert refusal is not None and refusal.details["grants_per_s"] == 2.0 and refusal.details["retry_after_s"] == 1
    clock.now += 11  # its own grants left the window, and the next count finds none in it either
    in_db["granted"] = 0
    refusal = await backlog.reserve()
    assert len(windows) == 2
    assert refusal is not None and refusal.details["grants_per_s"] == 0.0 and refusal.details["retry_after_s"] == 100


async def test_without_a_limit_nothing_is_counted() -> None:
    async def count(cap: int, window_s: float) -> tuple[int, int]:
        raise AssertionError("no limit: no count")

    backlog = Backlog(QueueSettings(max_backlog=0), count)
    assert await backlog.reserve() is None


# --- the handler ------------------------------------------------------------------------------------------------------
async def test_a_full_queue_refuses_before_quota_is_asked_and_admits_again_once_drained(
        monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeQueueStore()
    monkeypatch.setattr(handlers, "store", fake)
    rt = FakeRuntime("queue", stores=(fake,))
    settings = QueueSettings(max_backlog=2, backlog_refresh_s=0.001)
    h = QueueHandlers(rt, settings)  # type: ignore[arg-type]
    await rt.mount(routes(h))
    asked: list[AdmitJob] = []

    async def quota_admits(cmd: AdmitJob) -> Reply:
        asked.append(cmd)
        if cmd.team != "research":
            return Reply.failure(422, "UnknownTeam", f"team {cmd.team!r} does not exist")
        return Reply.success({"admitted": True, "priority_class": "normal", "priority": 100})
    await rt.serve(subjects.CMD_QUOTA_ADMIT, AdmitJob, quota_admits)

    for _ in range(3):  # refused by quota: each gives its reserved place back
        unknown = await rt.request(subjects.CMD_QUEUE_SUBMIT_JOB, submit(team="nobody"))
        assert unknown.error is not None and unknown.error.reason == "UnknownTeam"
    asked.clear()
    first = await rt.request(subjects.CMD_QUEUE_SUBMIT_JOB, submit(idempotency_key="a"))
    second = await rt.request(subjects.CMD_QUEUE_SUBMIT_JOB, submit())
    assert first.ok and second.ok
    refused = await rt.request(subjects.CMD_QUEUE_SUBMIT_JOB, submit())
    assert refused.error is not None and (refused.error.status, refused.error.reason) == (429, "QueueFull")
    assert refused.error.detail["backlog"] == 2 and refused.error.detail["max_backlog"] == 2
    assert refused.error.detail["retry_after_s"] == settings.retry_after_max_s  # nothing granted yet
    assert len(asked) == 2 and len(fake.jobs) == 2
    replay = await rt.request(subjects.CMD_QUEUE_SUBMIT_JOB, submit(idempotency_key="a"))
    assert replay.ok and replay.result["created"] is False  # a replay is answered even when the queue is full

    await rt.deliver(granted(first.result["job_id"]))
    again = await rt.request(subjects.CMD_QUEUE_SUBMIT_JOB, submit())
    assert again.ok and again.result["state"] == "pending" and len(fake.jobs) == 3
    full = await rt.request(subjects.CMD_QUEUE_SUBMIT_JOB, submit())
    assert full.error is not None and full.error.status == 429
    assert full.error.detail["grants_per_s"] > 0 and full.error.detail["retry_after_s"] < settings.retry_after_max_s
