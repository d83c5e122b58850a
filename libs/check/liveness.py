"""Liveness: the platform is still doing its work, not only doing nothing wrong. A scheduler that stopped passes every
safety invariant; these rules catch it. Pure functions of a Snapshot, like libs/check/invariants.py.

Clocks: a job's age is measured on the queue's database clock (`store.now`, and the outbox's `created_at`, both the
database's now()), so it never depends on the checker's clock. The queue is read before placement, so whatever the
queue had emitted and placement applied is visible in placement's snapshot: "placement has not applied it" is exact."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from libs.check.invariants import Result, maybe_pruned
from libs.check.model import Violation
from libs.check.snapshot import OutboxRow, ServiceStore
from libs.contracts import subjects

# decided_at comes from placement's clock, submitted_at from the queue's: a decision this much older still counts
DECISION_CLOCK_SLACK = timedelta(seconds=5)


def _latest_decision(placement: ServiceStore) -> datetime | None:
    rows = placement.rows("decisions")
    return rows[0]["latest"] if rows else None


def _decision_phrase(placement: ServiceStore) -> str:
    latest = _latest_decision(placement)
    if latest is None:
        return "placement has recorded no decision at all"
    return f"placement's latest recorded decision is from {latest:%H:%M:%S} ({_age(placement.now, latest):.1f}s ago)"


def _age(now: datetime, then: datetime) -> float:
    return (now - then).total_seconds()


def _since(job: dict[str, Any], changed: OutboxRow | None, submitted: OutboxRow | None,
           queue: ServiceStore) -> tuple[str, datetime | None, OutboxRow | None, str]:
    """Since when the queue has wanted placement to consider the job, and how:
    ("submitted", its latest job.submitted's time, that row, ""), ("backoff", None, None, until) while a requeue
    back-off lasts, ("unsubmitted", since, None, why) when the queue owes placement a job.submitted."""
    requeue_at = job.get("requeue_at")
    if submitted is not None and (changed is None or submitted.seq > changed.seq):
        return "submitted", submitted.created_at, submitted, ""
    if requeue_at is not None:
        if requeue_at > queue.now:
            return "backoff", None, None, f"{requeue_at:%H:%M:%S}"
        return "unsubmitted", requeue_at, None, (
            f"its requeue back-off ended at {requeue_at:%H:%M:%S} but the queue has not emitted its job.submitted "
            "again (is its requeue sweep running?)")
    if changed is not None:
        reason = (changed.data or {}).get("reason")
        return "unsubmitted", changed.created_at, None, (
            f"the queue made it pending at {changed.created_at:%H:%M:%S} ({reason}) and emitted no job.submitted "
            "since")
    # no events left: pruned (before the outbox horizon: wanted at least since then) or never emitted (job_state
    # reports that); judge on what placement holds, from the job's submission
    return "submitted", job.get("submitted_at"), None, ""


def job_liveness(queue: ServiceStore, placement: ServiceStore, max_age_s: float) -> Result:
    """Every job the queue has wanted placement to consider for longer than `max_age_s` (not in a requeue back-off)
    is known to placement and was considered by a scheduling cycle: placed (`satisfied`) or given a pending reason.

    Exact semantics of placement's fields (services/placement/store.py, handlers.py `_cycle`): applying a
    job.submitted upserts its `pending_jobs` row with `satisfied = false, reason = NULL`; every later cycle either
    places the job (`satisfied`, never a reason) or writes the reason the core gave it (only when it changed, so a
    reason, once written, stays until the next submission). A non-null reason therefore means "a cycle considered
    it since placement last learned of it". A job placement applied the submission of but does not want is
    `job_placement`'s `pending_job_not_wanted`, not reported here twice."""
    changed: dict[str, OutboxRow] = {}
    submitted: dict[str, OutboxRow] = {}
    for r in sorted(queue.outbox, key=lambda r: r.seq):
        job_id = (r.data or {}).get("job_id")
        if r.subject == subjects.JOB_STATE_CHANGED and (r.data or {}).get("current") == "pending":
            changed[job_id] = r
        elif r.subject == subjects.JOB_SUBMITTED:
            submitted[job_id] = r
    wanted = {r["job_id"]: r for r in placement.rows("pending_jobs")}
    finished = {r["job_id"] for r in placement.rows("finished_jobs")}
    applied = placement.inbox.get("placement", set())
    out: list[Violation] = []
    n = 0
    for job in sorted((j for j in queue.rows("jobs") if j["state"] == "pending"), key=lambda j: j["job_id"]):
        job_id = job["job_id"]
        how, since, event, why = _since(job, changed.get(job_id), submitted.get(job_id), queue)
        n += 1
        if how == "backoff" or job_id in finished:
            continue  # backing off on purpose; or cancelled/completed since the queue's snapshot
        age = _age(queue.now, since) if since is not None else float("inf")
        if age <= max_age_s:
            continue
        data: dict[str, Any] = {"age_s": round(age, 3), "bound_s": max_age_s}
        if how == "unsubmitted":
            out.append(Violation("job_liveness", "job_not_submitted", job_id,
                                 f"pending for {age:.1f}s (bound {max_age_s:g}s) but placement was never told: "
                                 f"{why}", data))
            continue
        row = wanted.get(job_id)
        if event is not None and not maybe_pruned(placement.inbox_pruned_before, event.created_at):
            data["event_id"] = event.event_id
            if event.event_id not in applied:
                where = (f"published at {event.published_at:%H:%M:%S}" if event.published
                         else f"still unpublished in the queue's outbox after {event.attempts} attempt(s)")
                earlier = (f"; its pending_jobs row is from an earlier submission (satisfied={row['satisfied']})"
                           if row is not None else "")
                out.append(Violation(
                    "job_liveness", "job_not_known_to_placement", job_id,
                    f"the queue wants it since {since:%H:%M:%S} ({age:.1f}s, bound {max_age_s:g}s): its "
                    f"job.submitted {event.event_id} ({where}) was never applied by placement{earlier}", data))
                continue
            if row is None:
                continue  # applied yet not wanted: job_placement's pending_job_not_wanted
        elif row is None:
            out.append(Violation(
                "job_liveness", "job_not_known_to_placement", job_id,
                f"the queue wants it for {age:.1f}s (bound {max_age_s:g}s), placement has no pending_jobs row for "
                "it", data))
            continue
        if row["satisfied"] or row["reason"] is not None:
            continue
        latest = _latest_decision(placement)
        data["latest_decision_at"] = latest.isoformat() if latest else None
        out.append(Violation(
            "job_liveness", "job_never_considered", job_id,
            f"the queue wants it for {age:.1f}s (bound {max_age_s:g}s) and placement knows it (pending_jobs row, not "
            f"placed) but no scheduling cycle has given it a reason; {_decision_phrase(placement)}", data))
    return n, out


def scheduler_progress(placement: ServiceStore, max_age_s: float) -> Result:
    """A job placement has wanted (unplaced) for longer than `max_age_s` was decided on: its latest recorded
    decision is no older than the newest such job's submission. Not "the latest decision is younger than the
    bound": a cycle whose reasons equal the last recorded ones is not recorded (handlers.py `_record_decision`), so a
    stable backlog legitimately records nothing for hours. A new job always changes the reasons (its id is in them)
    or is placed, so the cycle that first considers it is recorded, after its submission. A stalled leader shows up
    as wanted jobs submitted after its last decision. Nothing pending: nothing to decide, skipped."""
    latest = _latest_decision(placement)
    rows = placement.rows("pending_jobs")
    old = [r for r in rows if not r["satisfied"] and r["submitted_at"] is not None
           and _age(placement.now, r["submitted_at"]) > max_age_s]
    stalled = sorted((r for r in old if latest is None or latest < r["submitted_at"] - DECISION_CLOCK_SLACK),
                     key=lambda r: (r["submitted_at"], r["job_id"]))
    if not stalled:
        return len(old), []
    first = stalled[0]
    age = _age(placement.now, first["submitted_at"])
    return len(old), [Violation(
        "scheduler_progress", "no_decision_since_submission", "placement",
        f"{len(stalled)} wanted job(s) unplaced for more than {max_age_s:g}s were submitted after "
        f"{'any' if latest is None else 'its latest'} decision (oldest {first['job_id']}, submitted "
        f"{first['submitted_at']:%H:%M:%S}, {age:.1f}s ago); {_decision_phrase(placement)}: no scheduling cycle has "
        "decided anything since (is a leader scheduling?)",
        {"jobs": len(stalled), "oldest_job_id": first["job_id"], "oldest_age_s": round(age, 3),
         "latest_decision_at": latest.isoformat() if latest else None, "bound_s": max_age_s,
         "job_ids": [r["job_id"] for r in stalled[:20]]})]


def telemetry_liveness(inventory: ServiceStore, max_age_s: float) -> Result:
    """Every node inventory holds as `ready`, registered longer ago than `max_age_s`, has a GPU sample stored that
    is younger than `max_age_s`. A node whose agent stopped is inventory's to declare `lost` (then it is not
    reported here); a ready node without fresh samples means samples are sent but not stored, or never sent while
    the node is still believed alive: a telemetry consumer that started late or stalled, a stream not bound, a first
    sample lost. (A fresh machine's CI once waited 60 s for samples that never reached `/v1/nodes`.)"""
    rows = [r for r in inventory.rows("node_samples") if r["gpus"] and r["state"] == "ready"
            and _age(inventory.now, r["registered_at"]) > max_age_s]
    out = []
    for r in sorted(rows, key=lambda r: (r["cluster"], r["node"])):
        latest = r["latest_sample"]
        if latest is not None and _age(inventory.now, latest) <= max_age_s:
            continue
        what = "no sample of its GPUs was ever stored" if latest is None else \
            f"its GPUs' newest stored sample is from {latest:%H:%M:%S} ({_age(inventory.now, latest):.1f}s ago)"
        out.append(Violation(
            "telemetry_liveness", "no_fresh_sample", f"{r['cluster']}/{r['node']}",
            f"inventory holds the node as ready (registered {r['registered_at']:%H:%M:%S}, "
            f"{_age(inventory.now, r['registered_at']):.1f}s ago) but {what}; bound {max_age_s:g}s: is the agent "
            "sending and inventory's telemetry consumer applying (consumer_lag names a stalled one)?",
            {"registered_at": r["registered_at"].isoformat(), "bound_s": max_age_s,
             "latest_sample_at": latest.isoformat() if latest else None}))
    return len(rows), out
