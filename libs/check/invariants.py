"""The invariants, as pure functions of a Snapshot. Each returns (entities examined, violations).

Every cross-service comparison is exact, not "eventually": a downstream service's database is read before its
upstream's (so anything the downstream applied was committed upstream first), and what a consumer has applied is
known exactly from its inbox (the event ids it recorded in the same transaction as their effect). A lagging
consumer therefore never looks like a violation here; lag has its own bound (consumer_lag).

Retention (libs/store/retention.py) deletes published outbox rows and inbox rows older than a horizon each store
records (`outbox_pruned_before`, `inbox_pruned_before`). A row is written after the fact it records, so a fact at or
after the horizon still has its rows: such entities are checked exactly. Only an event or inbox row of a fact before
the horizon (`maybe_pruned`) may be missing, and its absence alone is never reported; what is left of it still is."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from libs.check.model import Violation
from libs.check.snapshot import OutboxRow, ServiceStore, Snapshot, StreamView
from libs.contracts import subjects
from libs.contracts.origins import OWNERS, TYPE_OWNERS, owner_of, source_allowed

STATE_CHANGED = subjects.JOB_STATE_CHANGED
GRANTED = subjects.ALLOCATION_GRANTED
RELEASED = subjects.ALLOCATION_RELEASED
JOB_STATES = frozenset({"awaiting_approval", "pending", "launching", "running", "preempting", "completed", "cancelled",
                        "failed"})
TERMINAL = frozenset({"completed", "cancelled", "failed"})
NOT_REQUEUED = frozenset({"JobCompleted", "JobCancelled", "ScaledDown"})  # releases the queue leaves alone
ONE_US = timedelta(microseconds=1)
# Entity times (submitted_at, granted_at, the envelope's time) come from the service's clock, horizons from its
# database's: facts this close after a horizon still count as maybe pruned.
CLOCK_SLACK = timedelta(seconds=60)
EPS = 1e-9

Result = tuple[int, list[Violation]]


def stream_of(subject: str) -> str | None:
    """The stream that captures `subject` (gpupool's streams have disjoint `prefix.>` subjects)."""
    for spec in subjects.STREAMS:
        for pattern in spec.subjects:
            if subjects.matches(pattern, subject):
                return spec.name
    return None


def maybe_pruned(horizon: datetime | None, t: datetime | None) -> bool:
    """Whether retention may have deleted the outbox/inbox rows of a fact that happened at `t`, given the store's
    horizon (rows older than it may be gone; None: nothing was ever pruned)."""
    return horizon is not None and (t is None or t < horizon + CLOCK_SLACK)


def held_us(start: datetime, end: datetime) -> int:
    """Whole microseconds from start to end, never negative (accounting's acct_us)."""
    return max(0, (end - start) // ONE_US)


# --- events as the stream carries them ----------------------------------------------------------------------------
@dataclass(frozen=True)
class Emitted:
    """One event a service emitted (its outbox row), with the copy the stream holds when it was published."""

    row: OutboxRow
    data: dict[str, Any] | None  # the stream's copy if published and present, else the outbox's
    lost: bool  # published, yet absent from its stream (None streams: never lost)


def emitted(store: ServiceStore | None, subject: str, streams: StreamView | None) -> list[Emitted]:
    """The service's events on `subject` in the order it committed them (outbox seq)."""
    if store is None:
        return []
    by_id = _stream_copies(streams)
    out = []
    for row in sorted((r for r in store.outbox if r.subject == subject), key=lambda r: r.seq):
        stream = stream_of(row.subject)
        lost = bool(streams is not None and row.published and stream is not None
                    and not _retention_expired(streams, stream, row) and not streams.has(stream, row.event_id))
        copy = by_id.get(row.event_id)
        out.append(Emitted(row, copy if copy is not None else row.data, lost))
    return out


def _stream_copies(streams: StreamView | None) -> dict[str, dict[str, Any]]:
    if streams is None:
        return {}
    return {e.event_id: e.data for e in streams.events if e.event_id and e.data is not None}


def _retention_expired(streams: StreamView, stream: str, row: OutboxRow) -> bool:
    max_age = streams.max_age_s.get(stream, 0)
    return bool(max_age) and row.published_at is not None and (
        streams.read_at - row.published_at).total_seconds() > max_age


# --- gpu_exclusive --------------------------------------------------------------------------------------------------
def gpu_exclusive(placement: ServiceStore) -> Result:
    allocations = {a["allocation_id"]: a for a in placement.rows("allocations")}
    gpu_memory = {g["uuid"]: g["memory_mib"] for g in placement.rows("gpus")}
    out: list[Violation] = []
    holders: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for g in placement.rows("allocation_gpus"):
        a = allocations.get(g["allocation_id"])
        live_alloc = a is not None and a["released_at"] is None
        if a is None:
            out.append(Violation("gpu_exclusive", "gpu_row_without_allocation", g["gpu_uuid"],
                                 f"allocation_gpus names allocation {g['allocation_id']}, which does not exist"))
        elif g["live"] != live_alloc:
            out.append(Violation(
                "gpu_exclusive", "live_flag_mismatch", g["gpu_uuid"],
                f"allocation {g['allocation_id']} is {'live' if live_alloc else 'released'} but its row for this "
                f"GPU says live={g['live']}", {"allocation_id": g["allocation_id"]}))
        if g["live"] or live_alloc:
            holders[g["gpu_uuid"]].append({**g, "job_id": a["job_id"] if a else None})
    for uuid, held in sorted(holders.items()):
        out += _gpu_holders(uuid, held, gpu_memory.get(uuid))
    per_replica: dict[tuple[str, int], list[str]] = defaultdict(list)
    for a in allocations.values():
        if a["released_at"] is None:
            per_replica[(a["job_id"], a["replica"])].append(a["allocation_id"])
    for (job, replica), ids in sorted(per_replica.items()):
        if len(ids) > 1:
            out.append(Violation("gpu_exclusive", "replica_double_held", job,
                                 f"replica {replica} of job {job} has {len(ids)} live allocations: {sorted(ids)}",
                                 {"replica": replica, "allocations": sorted(ids)}))
    return len(holders), out


def _who(h: dict[str, Any]) -> str:
    share = f"MIG {h['mig_profile']} slots {h['mig_start']}..{h['mig_start'] + h['mig_slots'] - 1}" \
        if h.get("mig_profile") else ("whole" if h["share_milli"] >= 1000 else f"{h['share_milli']} milli")
    return f"allocation {h['allocation_id']} (job {h['job_id']}, {share})"


def _gpu_holders(uuid: str, held: list[dict[str, Any]], memory: int | None) -> list[Violation]:
    if len(held) < 2:
        return []
    data = {"allocations": sorted(h["allocation_id"] for h in held)}
    whole = [h for h in held if not h.get("mig_profile") and h["share_milli"] >= 1000]
    mig = [h for h in held if h.get("mig_profile")]
    frac = [h for h in held if not h.get("mig_profile") and h["share_milli"] < 1000]
    out = []
    if whole:
        others = [h for h in held if h is not whole[0]]
        out.append(Violation("gpu_exclusive", "gpu_double_held", uuid,
                             f"held whole by {_who(whole[0])} and at the same time by "
                             + "; ".join(_who(h) for h in others), data))
        return out
    if mig and frac:
        out.append(Violation("gpu_exclusive", "mig_and_fraction", uuid,
                             f"MIG instances ({'; '.join(_who(h) for h in mig)}) and fractions "
                             f"({'; '.join(_who(h) for h in frac)}) live on one GPU", data))
    for i, a in enumerate(mig):
        for b in mig[i + 1:]:
            if a["mig_start"] < b["mig_start"] + b["mig_slots"] and b["mig_start"] < a["mig_start"] + a["mig_slots"]:
                out.append(Violation("gpu_exclusive", "mig_slot_double_held", uuid,
                                     f"{_who(a)} and {_who(b)} overlap", data))
    if frac:
        compute = sum(h["share_milli"] for h in frac)
        if compute > 1000:
            out.append(Violation("gpu_exclusive", "fraction_over_compute", uuid,
                                 f"fractions hold {compute} milli-GPU of 1000: " + "; ".join(_who(h) for h in frac),
                                 data))
        mem = sum(h.get("memory_mib") or 0 for h in frac)
        if memory is not None and mem > memory:
            out.append(Violation("gpu_exclusive", "fraction_over_memory", uuid,
                                 f"fractions hold {mem} MiB of the GPU's {memory} MiB: "
                                 + "; ".join(_who(h) for h in frac), data))
    return out


# --- job_state ------------------------------------------------------------------------------------------------------
def job_state(queue: ServiceStore, streams: StreamView | None) -> Result:
    jobs = {j["job_id"]: j for j in queue.rows("jobs")}
    by_job: dict[str, list[Emitted]] = defaultdict(list)
    out: list[Violation] = []
    for e in emitted(queue, STATE_CHANGED, streams):
        job_id = (e.data or {}).get("job_id")
        if job_id is None:
            out.append(Violation("job_state", "event_unreadable", e.row.event_id,
                                 "a job.state_changed event without a job_id"))
            continue
        by_job[job_id].append(e)
    history: dict[str, list[tuple[str | None, str]]] = defaultdict(list)
    for h in queue.rows("job_history"):
        if h["from_state"] != h["to_state"]:
            history[h["job_id"]].append((h["from_state"], h["to_state"]))
    for job_id, job in sorted(jobs.items()):
        state = job["state"]
        if state not in JOB_STATES:
            out.append(Violation("job_state", "job_state_invalid", job_id, f"state {state!r} is not a job state"))
        events = by_job.get(job_id, [])
        # submitted before the horizon: its first events may be pruned; what is left must still be the chain's end
        pruned = maybe_pruned(queue.outbox_pruned_before, job.get("submitted_at"))
        if not events:
            if not pruned:
                out.append(Violation("job_state", "job_without_events", job_id,
                                     f"job is {state} but queue never emitted a job.state_changed event for it"))
            continue
        for e in events:
            if e.lost:
                d = e.data or {}
                out.append(Violation(
                    "job_state", "job_event_missing", job_id,
                    f"its state_changed event {e.row.event_id} ({d.get('previous')} → {d.get('current')}) was "
                    f"published at {e.row.published_at:%H:%M:%S.%f} but is not in {stream_of(e.row.subject)}",
                    {"event_id": e.row.event_id}))
        chain = [((e.data or {}).get("previous"), (e.data or {}).get("current")) for e in events]
        previous: str | None = None
        for i, (e, (frm, to)) in enumerate(zip(events, chain, strict=True)):
            if frm != previous and not (pruned and i == 0):
                out.append(Violation(
                    "job_state", "job_event_chain_broken", job_id,
                    f"event #{i + 1} ({e.row.event_id}) moves {frm} → {to}, but the job was {previous} "
                    f"after the events before it", {"event_id": e.row.event_id, "position": i + 1}))
            previous = to
        if previous != state:
            out.append(Violation(
                "job_state", "job_state_mismatch", job_id,
                f"queue says {state}, but its {len(events)} state_changed events end in {previous} "
                f"(last: {events[-1].row.event_id})", {"state": state, "events_say": previous}))
        kept = history.get(job_id, [])
        if (kept[len(kept) - len(chain):] if pruned else kept) != chain:
            out.append(Violation(
                "job_state", "job_history_mismatch", job_id,
                f"job_history transitions {_arrows(history.get(job_id, []))} differ from its events "
                f"{_arrows(chain)}"))
    for job_id in sorted(set(by_job) - set(jobs)):
        out.append(Violation("job_state", "event_for_unknown_job", job_id,
                             f"{len(by_job[job_id])} state_changed event(s) for a job the queue does not have"))
    return len(jobs), out


def _arrows(chain: Iterable[tuple[str | None, str]]) -> str:
    return "[" + ", ".join(f"{a}→{b}" for a, b in chain) + "]"


# --- allocation_events ---------------------------------------------------------------------------------------------
def _gpu_key(g: dict[str, Any]) -> tuple:
    return (g.get("uuid") or g.get("gpu_uuid"), int(g.get("share_milli") or 1000), g.get("mig_profile") or None,
            g.get("mig_start"))


def _ts(value: Any) -> datetime | None:
    if value is None or isinstance(value, datetime):
        return value
    return datetime.fromisoformat(str(value).replace("Z", "+00:00"))


def allocation_events(placement: ServiceStore, streams: StreamView | None) -> Result:
    allocations = {a["allocation_id"]: a for a in placement.rows("allocations")}
    gpus: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for g in placement.rows("allocation_gpus"):
        gpus[g["allocation_id"]].append(g)
    granted: dict[str, list[Emitted]] = defaultdict(list)
    released: dict[str, list[Emitted]] = defaultdict(list)
    for target, subject in ((granted, GRANTED), (released, RELEASED)):
        for e in emitted(placement, subject, streams):
            target[(e.data or {}).get("allocation_id", "?")].append(e)
    out: list[Violation] = []
    horizon = placement.outbox_pruned_before
    for alloc_id, a in sorted(allocations.items()):
        held = sorted(_gpu_key(g) for g in gpus.get(alloc_id, []))
        g_events, r_events = granted.get(alloc_id, []), released.get(alloc_id, [])
        if len(g_events) != 1 and not (not g_events and maybe_pruned(horizon, a["granted_at"])):
            out.append(Violation("allocation_events", "granted_missing" if not g_events else "granted_duplicated",
                                 alloc_id, f"job {a['job_id']}: {len(g_events)} allocation.granted events (want 1)"))
        for e in g_events:
            out += _compare_event(e, a, held, "granted_at", a["granted_at"])
        if a["released_at"] is None:
            if r_events:
                out.append(Violation("allocation_events", "released_while_live", alloc_id,
                                     f"job {a['job_id']}: allocation is live but {len(r_events)} allocation.released "
                                     f"event(s) say it was released ({r_events[0].row.event_id})"))
            continue
        if len(r_events) != 1 and not (not r_events and maybe_pruned(horizon, a["released_at"])):
            out.append(Violation("allocation_events", "released_missing" if not r_events else "released_duplicated",
                                 alloc_id, f"job {a['job_id']}: released at {a['released_at']} "
                                           f"({a['release_reason']}) with {len(r_events)} allocation.released events"))
        for e in r_events:
            out += _compare_event(e, a, held, "released_at", a["released_at"])
            if (e.data or {}).get("reason") != a["release_reason"]:
                out.append(Violation("allocation_events", "event_mismatch", alloc_id,
                                     f"released event {e.row.event_id} says reason {(e.data or {}).get('reason')}, "
                                     f"placement says {a['release_reason']}"))
    for alloc_id in sorted((set(granted) | set(released)) - set(allocations)):
        out.append(Violation("allocation_events", "event_for_unknown_allocation", alloc_id,
                             "placement emitted events for an allocation it does not have"))
    return len(allocations), out


def _compare_event(e: Emitted, a: dict[str, Any], held: list[tuple], time_field: str, when: datetime) -> list[Violation]:
    out = []
    d = e.data or {}
    kind = "granted" if time_field == "granted_at" else "released"
    if e.lost:
        out.append(Violation("allocation_events", f"{kind}_event_missing", a["allocation_id"],
                             f"{kind} event {e.row.event_id} was published but is not in {stream_of(e.row.subject)}",
                             {"event_id": e.row.event_id}))
    wrong = [f for f in ("job_id", "team", "cluster", "node", "replica") if d.get(f, 0 if f == "replica" else None)
             != a[f]]
    if _ts(d.get(time_field)) != when:
        wrong.append(f"{time_field} ({d.get(time_field)} vs {when.isoformat()})")
    if sorted(_gpu_key(g) for g in d.get("gpus", [])) != held:
        wrong.append("gpus")
    if wrong:
        out.append(Violation("allocation_events", "event_mismatch", a["allocation_id"],
                             f"{kind} event {e.row.event_id} disagrees with placement on {', '.join(wrong)}"))
    return out


# --- quota_use ----------------------------------------------------------------------------------------------------
def live_use(placement: ServiceStore, skip: frozenset[str] = frozenset()) -> dict[tuple[str, str], float]:
    """GPUs each (team, model) holds now, shares counted by their share: what quota use is made of."""
    live = {a["allocation_id"]: a for a in placement.rows("allocations")
            if a["released_at"] is None and a["allocation_id"] not in skip}
    use: dict[tuple[str, str], float] = defaultdict(float)
    for g in placement.rows("allocation_gpus"):
        a = live.get(g["allocation_id"])
        if a is not None:
            use[(a["team"], g["model"])] += g["share_milli"] / 1000
    return dict(use)


def use_at(placement: ServiceStore, t: datetime) -> dict[tuple[str, str], float]:
    """Quota use at instant t, rebuilt from grant and release times (as placement's metric computes it: GPUs ×
    the allocation's smallest share, charged to its smallest model name)."""
    per_alloc: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for g in placement.rows("allocation_gpus"):
        per_alloc[g["allocation_id"]].append(g)
    use: dict[tuple[str, str], float] = defaultdict(float)
    for a in placement.rows("allocations"):
        if a["granted_at"] <= t and (a["released_at"] is None or a["released_at"] > t):
            rows = per_alloc.get(a["allocation_id"], [])
            if rows:
                use[(a["team"], min(r["model"] for r in rows))] += len(rows) * min(r["share_milli"] for r in rows) / 1000
    return dict(use)


def _same_use(a: dict[tuple[str, str], float], b: dict[tuple[str, str], float]) -> bool:
    return all(abs(a.get(k, 0.0) - b.get(k, 0.0)) < 1e-6 for k in set(a) | set(b))


def quota_use(snapshot: Snapshot, placement: ServiceStore, report_window_s: float = 15.0) -> Result:
    # allocations granted before the outbox horizon may have lost their grant event: compared on neither side
    old = frozenset(a["allocation_id"] for a in placement.rows("allocations")
                    if maybe_pruned(placement.outbox_pruned_before, a["granted_at"]))
    use = live_use(placement, old)
    out: list[Violation] = []
    # 1. from the events: every allocation granted and not released, by team and model
    events_use: dict[tuple[str, str], float] = defaultdict(float)
    released = {(e.data or {}).get("allocation_id") for e in emitted(placement, RELEASED, snapshot.streams)}
    for e in emitted(placement, GRANTED, snapshot.streams):
        d = e.data or {}
        if d.get("allocation_id") not in released and d.get("allocation_id") not in old:
            for g in d.get("gpus", []):
                events_use[(d.get("team"), g.get("model"))] += int(g.get("share_milli") or 1000) / 1000
    for key in sorted(set(use) | set(events_use), key=str):
        if abs(use.get(key, 0.0) - events_use.get(key, 0.0)) > 1e-6:
            out.append(Violation("quota_use", "use_differs_from_events", f"{key[0]}/{key[1]}",
                                 f"live allocations hold {use.get(key, 0.0):g} GPUs, granted-minus-released events "
                                 f"say {events_use.get(key, 0.0):g}", {"team": key[0], "gpu_model": key[1]}))
    # 2. what placement's leader reports (gpupool_quota_used_gpus), computed once per cycle: it must equal the use at
    # some instant of the last few seconds (the metric is as old as the cycle that set it)
    reported = snapshot.reported_quota_use
    if reported is not None and snapshot.reported_at is not None:
        start = snapshot.reported_at - timedelta(seconds=report_window_s)
        moments = {start, snapshot.reported_at}
        for a in placement.rows("allocations"):
            for t in (a["granted_at"], a["released_at"]):
                if t is not None and start <= t <= snapshot.reported_at:
                    moments.add(t)
        if not any(_same_use(use_at(placement, t), reported) for t in moments):
            now = use_at(placement, snapshot.reported_at)
            diff = {f"{k[0]}/{k[1]}": (reported.get(k, 0.0), now.get(k, 0.0))
                    for k in sorted(set(now) | set(reported), key=str)
                    if abs(reported.get(k, 0.0) - now.get(k, 0.0)) > 1e-6}
            out.append(Violation(
                "quota_use", "reported_use_wrong", snapshot.reported_by or "placement",
                f"gpupool_quota_used_gpus matches the live allocations at no instant of the last "
                f"{report_window_s:g}s; (reported, live now): {diff}", {"differences": diff}))
    return len(use) + (len(reported) if reported else 0), out


# a lost node's work cannot report its end: its GPUs are released at once (placement's RELEASE_AT_ONCE)
RELEASED_WITHOUT_EXIT = frozenset({"NodeLost"})


# --- job_placement ----------------------------------------------------------------------------------------------
def job_placement(queue: ServiceStore, placement: ServiceStore) -> Result:
    """Queue was read before placement: whatever queue applied from placement is visible in placement. (A job
    placement holds GPUs for but the queue's snapshot lacks may be newer than that snapshot: the runner asks the
    queue again before reporting it. The rules that use events report only when both the event and the consumer's
    inbox row are there, so history pruned by retention makes them say less, never something false.)"""
    jobs = {j["job_id"]: j for j in queue.rows("jobs")}
    allocations = placement.rows("allocations")
    by_id = {a["allocation_id"]: a for a in allocations}
    finished = {r["job_id"] for r in placement.rows("finished_jobs")}
    wanted = {r["job_id"] for r in placement.rows("pending_jobs")}
    queue_applied = queue.inbox.get("queue", set())
    placement_applied = placement.inbox.get("placement", set())
    release_event = {(r.data or {}).get("allocation_id"): r.event_id for r in placement.outbox
                     if r.subject == RELEASED}
    grant_event = {(r.data or {}).get("allocation_id"): r.event_id for r in placement.outbox if r.subject == GRANTED}
    last_submitted: dict[str, str] = {}
    for r in sorted(queue.outbox, key=lambda r: r.seq):
        if r.subject == subjects.JOB_SUBMITTED and r.data:
            last_submitted[r.data.get("job_id")] = r.event_id
    out: list[Violation] = []
    live_by_job: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for a in allocations:
        if a["released_at"] is None:
            live_by_job[a["job_id"]].append(a)
    for a in allocations:  # GPUs that ran work go back only once the work's cgroup is empty (placement README)
        if a.get("work") and a["released_at"] is not None and not a.get("exited") \
                and a["release_reason"] not in RELEASED_WITHOUT_EXIT:
            out.append(Violation("job_placement", "work_released_before_exit", a["job_id"],
                                 f"allocation {a['allocation_id']} ran work and was released ({a['release_reason']}) "
                                 "before its agent reported the work's cgroup empty"))
    for job_id, live in sorted(live_by_job.items()):
        ids = sorted(a["allocation_id"] for a in live)
        if job_id not in jobs:
            out.append(Violation("job_placement", "allocation_for_unknown_job", job_id,
                                 f"placement holds GPUs ({ids}) for a job the queue does not have"))
        # work being stopped keeps its GPUs until its agent reports the cgroup empty (placement's README)
        if job_id in finished and not all(a.get("work") and a.get("preempt_deadline") for a in live):
            out.append(Violation("job_placement", "finished_job_holds_gpus", job_id,
                                 f"placement applied the job's completion/cancellation but still holds {ids}"))
    # a job once scaled may have been a replicated one when its releases came (the queue ignores those)
    scaled = {h["job_id"] for h in queue.rows("job_history") if str(h["reason"]).startswith("Scaled:")}
    for job_id, j in sorted(jobs.items()):
        single = j["replicas"] <= 1 and not j["gang_nodes"] and job_id not in scaled
        state = j["state"]
        if state in ("launching", "running", "preempting"):
            alloc = by_id.get(j["allocation_id"]) if j["allocation_id"] else None
            if alloc is None:
                out.append(Violation("job_placement", "running_without_allocation", job_id,
                                     f"queue says {state} on allocation {j['allocation_id']}, which placement does "
                                     "not have"))
            elif (single and alloc["released_at"] is not None and alloc["release_reason"] not in NOT_REQUEUED
                  and release_event.get(alloc["allocation_id"]) in queue_applied):
                out.append(Violation(
                    "job_placement", "running_after_release", job_id,
                    f"queue applied the release of {alloc['allocation_id']} ({alloc['release_reason']}) but the job "
                    f"is still {state}"))
        if state == "pending" and single:
            for a in live_by_job.get(job_id, []):
                if grant_event.get(a["allocation_id"]) in queue_applied:
                    out.append(Violation(
                        "job_placement", "pending_while_holding", job_id,
                        f"queue applied the grant of {a['allocation_id']} (still live) yet says pending"))
        if state == "pending":
            submitted = last_submitted.get(job_id)
            if submitted in placement_applied and job_id not in wanted and job_id not in finished:
                out.append(Violation(
                    "job_placement", "pending_job_not_wanted", job_id,
                    f"queue says pending and placement applied its job.submitted ({submitted}), but placement "
                    "neither wants nor finished it: it would never run"))
    return len(jobs), out


# --- ledger -------------------------------------------------------------------------------------------------------
def ledger(accounting: ServiceStore, placement: ServiceStore) -> Result:
    """Accounting was read before placement. `applied` is accounting's inbox: the allocation events it applied.
    An allocation granted before any of the horizons it depends on (placement's outbox, accounting's inbox and
    outbox) may have lost those rows, so it is not judged."""
    applied = accounting.inbox.get("accounting", set())
    intervals: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for iv in accounting.rows("gpu_intervals"):
        if not str(iv["gpu_uuid"]).startswith("legacy:"):
            intervals[iv["allocation_id"]].append(iv)
    ledger_rows = {r["allocation_id"]: r for r in accounting.rows("usage_ledger")}
    usage_events = {(r.data or {}).get("allocation_id"): r.data for r in accounting.outbox
                    if r.subject == subjects.USAGE_RECORDED}
    gpus: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for g in placement.rows("allocation_gpus"):
        gpus[g["allocation_id"]].append(g)
    grant_event = {(r.data or {}).get("allocation_id"): r.event_id for r in placement.outbox if r.subject == GRANTED}
    release_event = {(r.data or {}).get("allocation_id"): r.event_id for r in placement.outbox
                     if r.subject == RELEASED}
    out: list[Violation] = []
    allocations = {a["allocation_id"]: a for a in placement.rows("allocations")}
    horizons = [h for h in (placement.outbox_pruned_before, accounting.inbox_pruned_before,
                            accounting.outbox_pruned_before) if h is not None]
    horizon = max(horizons) if horizons else None
    for alloc_id, a in sorted(allocations.items()):
        if maybe_pruned(horizon, a["granted_at"]):
            continue
        ivs, row = intervals.get(alloc_id, []), ledger_rows.get(alloc_id)
        saw_grant = grant_event.get(alloc_id) in applied
        saw_release = release_event.get(alloc_id) in applied
        shares = sorted((g["gpu_uuid"], g["share_milli"]) for g in gpus.get(alloc_id, []))
        total = sum(s for _, s in shares)

        def bad(kind: str, detail: str, alloc_id: str = alloc_id) -> None:
            out.append(Violation("ledger", kind, alloc_id, detail))

        if not saw_release and not saw_grant:
            if ivs or row:
                bad("ledger_ahead_of_events", "accounting has rows for an allocation none of whose events it applied")
            continue
        if not ivs:
            bad("intervals_missing", f"accounting applied the {'release' if saw_release else 'grant'} but has no GPU "
                                     "interval for it")
        elif sorted((iv["gpu_uuid"], iv["share_milli"]) for iv in ivs) != shares:
            bad("interval_shares_differ", f"intervals hold {sorted((iv['gpu_uuid'], iv['share_milli']) for iv in ivs)}"
                                          f", placement {shares}")
        for iv in ivs:
            if iv["granted_at"] != a["granted_at"]:
                bad("interval_grant_differs", f"slot {iv['slot']} starts {iv['granted_at']}, the grant was at "
                                              f"{a['granted_at']}")
        if not saw_release:
            for iv in ivs:
                if iv["released_at"] is not None:
                    bad("interval_closed_early", f"slot {iv['slot']} closed at {iv['released_at']} though "
                                                 "accounting never applied the release")
            if row is not None:
                bad("ledger_row_early", "a ledger row exists though accounting never applied the release")
            continue
        if a["released_at"] is None:
            bad("release_unknown_to_placement", "accounting applied a release placement does not have")
            continue
        for iv in ivs:
            want = max(a["released_at"], iv["granted_at"])
            if iv["released_at"] != want:
                bad("interval_release_differs", f"slot {iv['slot']} ends {iv['released_at']}, the release was at "
                                                f"{a['released_at']}")
        milli_us = held_us(a["granted_at"], a["released_at"]) * total
        if row is None:
            bad("ledger_row_missing", f"released {a['released_at']} ({a['release_reason']}) and applied, but no "
                                      "usage_ledger row")
            continue
        wrong = []
        if row["started_at"] != a["granted_at"] or row["ended_at"] != a["released_at"]:
            wrong.append(f"interval {row['started_at']}..{row['ended_at']} vs {a['granted_at']}..{a['released_at']}")
        if row["gpu_count"] != len(shares) or row["share_milli"] != total:
            wrong.append(f"{row['gpu_count']} GPUs/{row['share_milli']} milli vs {len(shares)}/{total}")
        if row["gpu_milli_us"] != milli_us:
            wrong.append(f"gpu_milli_us {row['gpu_milli_us']} vs (release − grant) × share = {milli_us}")
        from_intervals = sum(held_us(iv["granted_at"], iv["released_at"]) * iv["share_milli"] for iv in ivs
                             if iv["released_at"] is not None)
        if ivs and from_intervals != row["gpu_milli_us"]:
            wrong.append(f"Σ intervals {from_intervals} milli-GPU-µs vs ledger {row['gpu_milli_us']}")
        if wrong:
            bad("ledger_row_wrong", "; ".join(wrong))
        usage = usage_events.get(alloc_id)
        if usage is None:
            bad("usage_event_missing", "ledger row without its usage.recorded event")
        elif float(usage.get("gpu_seconds", -1)) != row["gpu_milli_us"] / 1e9:
            bad("usage_event_wrong", f"usage.recorded says {usage.get('gpu_seconds')} GPU-s, the ledger "
                                     f"{row['gpu_milli_us'] / 1e9}")
    for alloc_id in sorted((set(intervals) | set(ledger_rows)) - set(allocations)):
        out.append(Violation("ledger", "unknown_allocation", alloc_id,
                             "accounting has rows for an allocation placement does not have"))
    return len(allocations), out


# --- outbox -------------------------------------------------------------------------------------------------------
def outbox(stores: Iterable[ServiceStore], max_age_s: float) -> Result:
    out: list[Violation] = []
    n = 0
    for store in stores:
        n += len(store.outbox)
        stuck = [r for r in store.outbox if not r.published
                 and (store.now - r.created_at).total_seconds() > max_age_s]
        if stuck:
            oldest = min(stuck, key=lambda r: r.created_at)
            age = (store.now - oldest.created_at).total_seconds()
            out.append(Violation(
                "outbox", "outbox_stuck", store.service,
                f"{len(stuck)} event(s) unpublished for more than {max_age_s:g}s; oldest {oldest.event_id} "
                f"({oldest.subject}) for {age:.1f}s, {oldest.attempts} attempt(s)"
                + (f", last error {oldest.last_error}" if oldest.last_error else ""),
                {"count": len(stuck), "oldest_event_id": oldest.event_id, "oldest_age_s": round(age, 3)}))
    return n, out


# --- event_delivery -----------------------------------------------------------------------------------------------
def event_delivery(stores: Iterable[ServiceStore], streams: StreamView,
                   foreign: dict[str, str] | None = None) -> Result:
    """`foreign`: stream event id → claimed source, for service-sourced events in the stream that no snapshot had
    (the runner rechecks those against the outbox after the streams were read; what is left over goes here)."""
    out: list[Violation] = []
    n = 0
    for store in stores:
        for row in store.outbox:
            stream = stream_of(row.subject)
            if not row.published or stream is None or stream not in streams.ids:
                continue
            n += 1
            if not _retention_expired(streams, stream, row) and not streams.has(stream, row.event_id):
                out.append(Violation(
                    "event_delivery", "event_missing_from_stream", row.event_id,
                    f"{store.service} published {row.subject} at {row.published_at} (outbox seq {row.seq}) but "
                    f"{stream} does not hold it", {"service": store.service, "subject": row.subject}))
    for event_id, source in sorted((foreign or {}).items()):
        out.append(Violation("event_delivery", "event_without_outbox_row", event_id,
                             f"the stream holds an event from {source} that its outbox never held"))
    return n, out


# --- consumer_lag -------------------------------------------------------------------------------------------------
def consumer_lag(streams: StreamView, max_age_s: float) -> Result:
    out: list[Violation] = []
    for c in streams.consumers:
        if c.oldest_time is None:
            continue
        age = (streams.read_at - c.oldest_time).total_seconds()
        if age > max_age_s:
            delivered = c.oldest_seq is not None and c.oldest_seq <= c.delivered_seq
            state = ("delivered, never acknowledged" if delivered
                     else "never delivered" + ("; no pull request is waiting: nobody is fetching"
                                               if c.num_waiting == 0 else ""))
            out.append(Violation(
                "consumer_lag", "consumer_lagging", f"{c.stream}/{c.name}",
                f"oldest unprocessed message (seq {c.oldest_seq}, {c.oldest_subject}) is {age:.1f}s old "
                f"(bound {max_age_s:g}s), {state}; {c.num_pending} undelivered, {c.num_ack_pending} awaiting ack, "
                f"{c.num_redelivered} redelivered",
                {"stream": c.stream, "consumer": c.name, "age_s": round(age, 3), "oldest_seq": c.oldest_seq,
                 "oldest_subject": c.oldest_subject, "delivered": delivered, "num_pending": c.num_pending,
                 "num_ack_pending": c.num_ack_pending, "num_redelivered": c.num_redelivered,
                 "num_waiting": c.num_waiting}))
    return len(streams.consumers), out


# --- dead_letters -------------------------------------------------------------------------------------------------
def dead_letters(stores: Iterable[ServiceStore], streams: StreamView) -> Result:
    emitted_ids = {r.event_id: s.service for s in stores for r in s.outbox}
    out = []
    for d in streams.dead_letters:
        if d.event_id and d.event_id in emitted_ids:
            out.append(Violation(
                "dead_letters", "event_dead_lettered", d.event_id,
                f"{emitted_ids[d.event_id]}'s event ({d.subject}, {d.stream} seq {d.stream_seq}) was dead-lettered "
                f"by {d.consumer}: {d.reason}: {d.error[:200]}", {"consumer": d.consumer, "reason": d.reason}))
    return len(streams.dead_letters), out


# --- event_origins -----------------------------------------------------------------------------------------------
def event_origins(streams: StreamView) -> Result:
    """An event in the stream whose source is not its type's owner got past NATS permissions (a forger with some
    identity's credentials, or a tool publishing by hand): consumers refuse it, and it is named here."""
    out = []
    for e in streams.events:
        if e.type is None:
            continue
        if not source_allowed(e.type, e.source or ""):
            owner = owner_of(e.type)
            out.append(Violation(
                "event_origins", "event_from_wrong_source", e.event_id or f"seq {e.seq}",
                f"{e.type} on {e.subject} (seq {e.seq}) claims source {e.source!r}; "
                + (f"only /gpupool/{owner} publishes it" if owner else "no gpupool service publishes that type"),
                {"type": e.type, "source": e.source, "seq": e.seq}))
    return len(streams.events), out


def dead_letter_sources(streams: StreamView) -> dict[str, int]:
    """Dead letters by the source they claim, those that are not a service's marked: forgeries turned away."""
    services = set(OWNERS.values()) | set(TYPE_OWNERS.values())
    return dict(Counter((d.source or "?") if (d.source or "").removeprefix("/gpupool/").split("/")[0] in services
                        else f"{d.source or '?'} (not a service)" for d in streams.dead_letters))


def dead_letter_summary(streams: StreamView) -> dict[str, int]:
    return dict(Counter(f"{d.consumer}/{d.reason}" for d in streams.dead_letters))
