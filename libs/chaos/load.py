"""The load `gpupool chaos` puts on the platform while faults hit it (libs/chaos/suite.py runs it).

Jobs are submitted over HTTP at a steady rate, each with an Idempotency-Key and retried until a definite answer.
Two thirds hold GPUs without a command: the load completes each once it has run a short hold, or cancels it. A third
carry a command that the simulated fleet's agent really runs: a short one that exits 0, one that exits 3, and a long
one (`sleep 30`) that the load completes or cancels like a commandless job. The short ones end on their own: nobody
calls complete or cancel on them, and the only right end is their exit code's (`completed` with exit 0, `failed`
with exit 3). At the end every accepted job is looked up: one the queue does not have, one that is not where the
last acknowledged command put it, and one whose command did not end as its exit code says (`Lost`, another code, or
still open when it should long have ended) count as lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import httpx

TEAMS = ("research", "inference", "platform")
TERMINAL = {"completed", "cancelled", "failed"}
WORK_SHARE = 1 / 3  # of the load's jobs carry a command
STOP_GRACE_S = 2.0  # a command job's stop signal → kill (long jobs completed or cancelled by the load)
# kind → (argv, (state, exit code) it must end in on its own; None: the load ends it), weight
WORK_KINDS: dict[str, tuple[list[str], tuple[str, int] | None, float]] = {
    "ok": (["sh", "-c", "sleep 0.5; exit 0"], ("completed", 0), 0.4),
    "fail": (["sh", "-c", "sleep 0.5; exit 3"], ("failed", 3), 0.3),
    "long": (["sh", "-c", "sleep 30"], None, 0.3),
}
NATURAL_WAIT_S = 45.0  # the drain waits this long for jobs that end on their own before it cancels them


@dataclass
class Job:
    job_id: str
    key: str
    submitted_at: float
    hold_s: float
    cancel: bool  # this one is cancelled instead of completed
    running_since: float | None = None
    acked: str | None = None  # "complete" / "cancel": the last command the platform acknowledged with 200
    closed: bool = False  # the platform refused the command (409: it moved on); the drain cancels it if open
    work: str | None = None  # a job with a command: its kind (WORK_KINDS, or a round's own, e.g. "marker")
    expect: tuple[str, int] | None = None  # (state, exit code) it must end in on its own
    managed: bool = True  # the lifecycle loop completes / cancels it (a round's own jobs: the round does)
    drained: bool = False  # it should have ended on its own, yet the drain had to cancel it


@dataclass
class LoadStats:
    submitted: int = 0
    accepted: int = 0
    rejected: dict[str, int] = field(default_factory=dict)  # 4xx reason → count
    retried: int = 0  # submissions answered 5xx / not at all, retried with the same key
    completed: int = 0
    cancelled: int = 0
    work_jobs: int = 0  # accepted jobs with a command


class Load:
    def __init__(self, gateway: str, token: str, rate: float, rng: random.Random, *,
                 work_share: float = WORK_SHARE) -> None:
        self.api = httpx.AsyncClient(base_url=gateway, headers={"Authorization": f"Bearer {token}"}, timeout=10)
        self.rate = rate
        self.rng = rng
        self.work_share = work_share
        self.jobs: dict[str, Job] = {}
        self.unresolved: dict[str, tuple[dict, dict]] = {}  # Idempotency-Key → (body, Job fields), no answer yet
        self.stats = LoadStats()
        self.paused = False  # the lifecycle loop completes and cancels nothing meanwhile (a round wants it so)
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task] = []

    def start(self) -> None:
        self._tasks = [asyncio.create_task(self._submit_loop()), asyncio.create_task(self._lifecycle_loop())]

    async def stop(self) -> None:
        self._stop.set()
        for t in self._tasks:
            with contextlib.suppress(Exception):
                await t

    def body(self) -> dict:
        return {"name": f"chaos-{len(self.jobs)}", "team": self.rng.choice(TEAMS), "kind": self.rng.choice(
            ("training", "batch")), "gpus": self.rng.choice((1, 1, 1, 2, 2, 4)), "project": "chaos"}

    def next_job(self) -> tuple[dict, dict]:
        """The next submission: its body and what the load knows of it (the Job fields)."""
        body = self.body()
        if self.rng.random() >= self.work_share:
            return body, {"cancel": self.rng.random() < 0.15}
        kinds = list(WORK_KINDS)
        kind = self.rng.choices(kinds, weights=[WORK_KINDS[k][2] for k in kinds])[0]
        argv, expect, _ = WORK_KINDS[kind]
        body.update(name=f"chaos-{kind}-{len(self.jobs)}", command=argv, stop_grace_s=STOP_GRACE_S)
        return body, {"cancel": expect is None and self.rng.random() < 0.15, "work": kind, "expect": expect}

    async def submit(self, body: dict, *, hold_s: float | None = None, cancel: bool = False,
                     give_up_at: float | None = None, max_delay_s: float = 2.0, **fields: Any) -> Job | None:
        """POST until the platform says yes or no (same key every time, so a retry never makes a second job).
        Retries back off up to `max_delay_s` (the probe keeps it short: its answer is a measurement). `fields`:
        the rest of the Job (work, expect, managed)."""
        key = f"chaos-{uuid.uuid4()}"
        self.stats.submitted += 1
        fields = {"hold_s": hold_s if hold_s is not None else self.rng.uniform(1, 4), "cancel": cancel, **fields}
        self.unresolved[key] = (body, fields)
        delay = 0.2
        while True:
            try:
                r = await self.api.post("/v1/jobs", json=body, headers={"Idempotency-Key": key})
                if r.status_code in (200, 201):
                    self.unresolved.pop(key, None)
                    return self._accepted(r.json()["job_id"], key, fields)
                if 400 <= r.status_code < 500:
                    reason = (r.json() or {}).get("reason", str(r.status_code)) if r.content else str(r.status_code)
                    self.stats.rejected[reason] = self.stats.rejected.get(reason, 0) + 1
                    self.unresolved.pop(key, None)
                    return None
            except (httpx.HTTPError, ValueError):
                pass
            self.stats.retried += 1
            if give_up_at is not None and time.monotonic() > give_up_at:
                return None  # stays unresolved: the final tally looks it up again
            await asyncio.sleep(delay)
            delay = min(max_delay_s, delay * 2)

    def _accepted(self, job_id: str, key: str, fields: dict) -> Job:
        job = self.jobs.get(job_id)
        if job is None:
            job = self.jobs[job_id] = Job(job_id, key, time.monotonic(), **fields)
            self.stats.accepted += 1
            self.stats.work_jobs += job.work is not None
        return job

    async def _submit_loop(self) -> None:
        pending: set[asyncio.Task] = set()
        next_at = time.monotonic()
        while not self._stop.is_set():
            body, fields = self.next_job()
            t = asyncio.create_task(self.submit(body, **fields))
            pending.add(t)
            t.add_done_callback(pending.discard)
            next_at += 1 / self.rate
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._stop.wait(), max(0.0, next_at - time.monotonic()))
        if pending:
            await asyncio.wait(pending, timeout=120)

    async def views(self, states: tuple[str, ...] | None = None) -> dict[str, dict]:
        """job id → the job as the queue lists it (state, exit_code, reason, node, …), every job or those in these
        states, following the cursor."""
        out: dict[str, dict] = {}
        for state in states or (None,):
            cursor = None
            while True:
                params = {"limit": 1000, **({"state": state} if state else {}), **({"cursor": cursor} if cursor else {})}
                r = await self.api.get("/v1/jobs", params=params)
                r.raise_for_status()
                doc = r.json()
                out.update({j["job_id"]: j for j in doc["items"]})
                cursor = doc.get("next")
                if not cursor:
                    break
        return out

    async def states(self, states: tuple[str, ...] | None = None) -> dict[str, str]:
        """job id → state for every job in the queue (or in these states)."""
        return {job_id: view["state"] for job_id, view in (await self.views(states)).items()}

    async def _lifecycle_loop(self) -> None:
        """Completes running jobs after their hold, cancels those meant to be cancelled; never touches a job that
        ends on its own (its command's exit ends it) or one a round looks after."""
        while not self._stop.is_set():
            with contextlib.suppress(httpx.HTTPError, ValueError, KeyError):
                running = {} if self.paused else await self.states(("running",))
                now = time.monotonic()
                for job_id in running:
                    job = self.jobs.get(job_id)
                    if job is None or job.acked or job.closed or job.expect or not job.managed:
                        continue
                    job.running_since = job.running_since or now
                    if now - job.running_since >= job.hold_s and not self.paused:
                        await self.finish(job, "cancel" if job.cancel else "complete")
                for job in list(self.jobs.values()):
                    if job.cancel and job.managed and not (job.acked or job.closed or self.paused) \
                            and job.job_id not in running and now - job.submitted_at > job.hold_s * 2:
                        await self.finish(job, "cancel")  # cancelled while still pending
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._stop.wait(), 0.5)

    async def finish(self, job: Job, how: str) -> bool:
        path = f"/v1/jobs/{job.job_id}/{how}"
        try:
            r = await self.api.post(path, json={"reason": "chaos load"} if how == "cancel" else None)
        except httpx.HTTPError:
            return False
        if r.status_code == 409:
            job.closed = True
        if r.status_code == 200:
            job.acked = how
            if how == "complete":
                self.stats.completed += 1
            else:
                self.stats.cancelled += 1
            return True
        return False

    async def _resolve(self) -> None:
        """Look each unanswered submission up again by its key."""
        for key, (body, fields) in list(self.unresolved.items()):
            with contextlib.suppress(httpx.HTTPError, ValueError):
                r = await self.api.post("/v1/jobs", json=body, headers={"Idempotency-Key": key})
                if r.status_code in (200, 201):
                    self._accepted(r.json()["job_id"], key, {**fields, "hold_s": 0, "cancel": True})
                    self.unresolved.pop(key)

    async def drain(self, timeout: float = 180, natural_wait_s: float = NATURAL_WAIT_S) -> dict[str, dict]:
        """No more submissions; settle every unresolved one; cancel what is still open — a job that ends on its
        own only once it had `natural_wait_s` to do so (then it is marked `drained`: it did not) —; wait until all
        is terminal. Returns the final job id → view."""
        await self.stop()
        started = time.monotonic()
        deadline = started + timeout
        await self._resolve()
        views: dict[str, dict] = {}
        while time.monotonic() < deadline:
            try:
                views = await self.views()
            except (httpx.HTTPError, ValueError):
                await asyncio.sleep(1)
                continue
            open_ = [j for j, v in views.items() if v["state"] not in TERMINAL and j in self.jobs]
            if not open_:
                break
            waited = time.monotonic() - started > natural_wait_s
            for job_id in open_:
                job = self.jobs[job_id]
                if job.expect and not waited:
                    continue
                if await self.finish(job, "cancel") and job.expect:
                    job.drained = True
            await asyncio.sleep(1)
        return views

    def verdict(self, views: dict[str, dict]) -> dict:
        lost, wrong, misended = [], [], []
        for job_id, job in self.jobs.items():
            view = views.get(job_id) or {}
            state = view.get("state")
            if state is None or state not in TERMINAL:
                lost.append({"job_id": job_id, "state": state, "work": job.work})
            elif job.acked == "complete" and state != "completed" or job.acked == "cancel" and state != "cancelled":
                wrong.append({"job_id": job_id, "acked": job.acked, "state": state})
            elif (why := outcome_problem(job, view)) is not None:
                misended.append({"job_id": job_id, "work": job.work, "state": state,
                                 "exit_code": view.get("exit_code"), "reason": view.get("reason"), "why": why})
        by_state: dict[str, int] = {}
        for job_id in self.jobs:
            s = (views.get(job_id) or {}).get("state", "missing")
            by_state[s] = by_state.get(s, 0) + 1
        outcomes: dict[str, int] = {}
        for job_id, job in self.jobs.items():
            if job.work is not None and job_id in views:
                v = views[job_id]
                key = f"{job.work} → {v['state']}" + (f" (exit {v['exit_code']})" if v.get("exit_code") is not None
                                                      else "")
                outcomes[key] = outcomes.get(key, 0) + 1
        return {"accepted": len(self.jobs), "lost": len(lost) + len(wrong) + len(misended),
                "missing_or_stuck": lost[:20], "not_where_acknowledged": wrong[:20],
                "work_misended": misended[:20], "unresolved_submissions": len(self.unresolved),
                "final_states": by_state, "work_jobs": sum(1 for j in self.jobs.values() if j.work is not None),
                "work_outcomes": outcomes}

    async def close(self) -> None:
        await self.api.aclose()


def outcome_problem(job: Job, view: dict) -> str | None:
    """Why a terminal job with a command did not end as it should have, or None. A job that ends on its own ends
    as its exit code says, unless the platform acknowledged a complete / cancel first; a long one the load ends
    never fails (nothing in it does)."""
    if job.work is None:
        return None
    if job.drained:
        return "still open at the drain: its exit never ended it"
    if job.acked:
        return None
    state, code = view.get("state"), view.get("exit_code")
    if job.expect is not None:
        if (state, code) != job.expect:
            return f"ended {state} with exit code {code} ({view.get('reason')}); its command exits {job.expect[1]}"
        return None
    if state == "failed":
        return f"failed ({view.get('reason')}, exit code {code}) though its command never does"
    return None
