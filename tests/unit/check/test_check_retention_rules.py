"""The checker's rule for pruned history (libs/check/invariants.py): an entity whose fact lies before a store's
retention horizon may have lost its events and inbox rows, and that absence alone is no violation; an entity after
the horizon is judged exactly as without retention, and what is left of an old one is still judged."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from libs.check import invariants
from libs.check.snapshot import OutboxRow, ServiceStore, Snapshot
from libs.contracts import subjects

NOW = datetime(2026, 11, 30, 12, tzinfo=UTC)
HORIZON = NOW - timedelta(days=7)
OLD = NOW - timedelta(days=40)
NEW = NOW - timedelta(hours=1)
_seq = iter(range(1, 10_000))


def row(subject: str, data: dict[str, Any], at: datetime) -> OutboxRow:
    n = next(_seq)
    return OutboxRow(seq=n, event_id=f"e{n}", subject=subject, created_at=at, published_at=at, data=data)


def kinds(result: invariants.Result) -> set[tuple[str, str]]:
    return {(v.kind, v.subject) for v in result[1]}


# --- job_state -------------------------------------------------------------------------------------------------------
def queue(jobs: list[tuple[str, str, datetime, list[tuple[str | None, str]]]], events: dict[str, list[tuple]],
          horizon: datetime | None) -> ServiceStore:
    """jobs: (id, state, submitted_at, history); events: job id → [(previous, current, at)] still in the outbox."""
    store = ServiceStore("queue", NOW, outbox_pruned_before=horizon)
    store.tables["jobs"] = [{"job_id": j, "state": s, "submitted_at": t, "team": "t", "allocation_id": None,
                             "replicas": 1, "gang_nodes": None, "attempts": 0} for j, s, t, _ in jobs]
    store.tables["job_history"] = [{"job_id": j, "from_state": a, "to_state": b, "reason": "x"}
                                   for j, _, _, h in jobs for a, b in h]
    store.outbox = [row(subjects.JOB_STATE_CHANGED, {"job_id": j, "previous": a, "current": b}, at)
                    for j, evs in events.items() for a, b, at in evs]
    return store


DONE = [(None, "pending"), ("pending", "running"), ("running", "completed")]


def test_an_old_job_without_events_is_a_violation_only_without_a_horizon() -> None:
    jobs = [("old", "completed", OLD, DONE)]
    assert kinds(invariants.job_state(queue(jobs, {}, None), None)) == {("job_without_events", "old")}
    assert kinds(invariants.job_state(queue(jobs, {}, HORIZON), None)) == set()


def test_a_job_after_the_horizon_without_events_is_a_violation() -> None:
    jobs = [("new", "completed", HORIZON + timedelta(minutes=2), DONE)]
    assert kinds(invariants.job_state(queue(jobs, {}, HORIZON), None)) == {("job_without_events", "new")}


def test_a_job_across_the_horizon_is_judged_on_what_is_left() -> None:
    events = {"j": [("running", "completed", NEW)]}  # submitted and started before the horizon: pruned
    ok = queue([("j", "completed", OLD, DONE)], events, HORIZON)
    assert kinds(invariants.job_state(ok, None)) == set()
    wrong_state = queue([("j", "failed", OLD, DONE)], events, HORIZON)
    assert kinds(invariants.job_state(wrong_state, None)) == {("job_state_mismatch", "j")}
    wrong_history = queue([("j", "completed", OLD, [(None, "pending"), ("pending", "cancelled")])], {
        "j": [("running", "completed", NEW)]}, HORIZON)
    assert ("job_history_mismatch", "j") in kinds(invariants.job_state(wrong_history, None))
    broken = queue([("j", "completed", OLD, DONE + [("completed", "completed")])], {
        "j": [("pending", "running", NEW), ("preempting", "completed", NEW)]}, HORIZON)
    assert ("job_event_chain_broken", "j") in kinds(invariants.job_state(broken, None))
    # the same job submitted after the horizon must have its whole chain
    new = queue([("j", "completed", NEW, DONE)], events, HORIZON)
    assert ("job_event_chain_broken", "j") in kinds(invariants.job_state(new, None))


# --- allocation_events, quota_use, ledger --------------------------------------------------------------------------
def allocation(alloc: str, granted: datetime, released: datetime | None) -> dict[str, Any]:
    return {"allocation_id": alloc, "job_id": f"job-{alloc}", "replica": 0, "team": "t", "project": "p",
            "cluster": "c", "node": "n", "granted_at": granted, "released_at": released,
            "release_reason": "JobCompleted" if released else None}


def event(a: dict[str, Any], kind: str) -> dict[str, Any]:
    d = {k: a[k] for k in ("allocation_id", "job_id", "team", "cluster", "node", "replica")}
    d["gpus"] = [{"uuid": f"gpu-{a['allocation_id']}", "share_milli": 1000, "model": "H100"}]
    if kind == "granted":
        d["granted_at"] = a["granted_at"].isoformat()
    else:
        d["released_at"] = a["released_at"].isoformat()
        d["reason"] = a["release_reason"]
    return d


def placement(allocs: list[dict[str, Any]], events: list[tuple[str, str]], horizon: datetime | None) -> ServiceStore:
    """events: (allocation id, 'granted' | 'released') still in the outbox."""
    store = ServiceStore("placement", NOW, outbox_pruned_before=horizon)
    store.tables["allocations"] = allocs
    store.tables["allocation_gpus"] = [{"allocation_id": a["allocation_id"], "gpu_uuid": f"gpu-{a['allocation_id']}",
                                        "gpu_index": 0, "model": "H100", "live": a["released_at"] is None,
                                        "share_milli": 1000, "memory_mib": None, "mig_profile": None,
                                        "mig_start": None, "mig_slots": None} for a in allocs]
    by_id = {a["allocation_id"]: a for a in allocs}
    subject = {"granted": subjects.ALLOCATION_GRANTED, "released": subjects.ALLOCATION_RELEASED}
    store.outbox = [row(subject[k], event(by_id[i], k), by_id[i]["granted_at" if k == "granted" else "released_at"])
                    for i, k in events]
    return store


def test_allocation_events_missing_before_the_horizon_are_not_violations_after_it_they_are() -> None:
    allocs = [allocation("old", OLD, OLD + timedelta(hours=1)), allocation("across", OLD, NEW),
              allocation("old-live", OLD, None), allocation("new", NEW, NEW + timedelta(minutes=5))]
    kept = [("across", "released")]
    assert kinds(invariants.allocation_events(placement(allocs, kept, HORIZON), None)) == {
        ("granted_missing", "new"), ("released_missing", "new")}
    assert kinds(invariants.allocation_events(placement(allocs, kept, None), None)) == {
        ("granted_missing", "old"), ("released_missing", "old"), ("granted_missing", "across"),
        ("granted_missing", "old-live"), ("granted_missing", "new"), ("released_missing", "new")}
    # released after the horizon: its release event is required
    assert ("released_missing", "across") in kinds(invariants.allocation_events(placement(allocs, [], HORIZON), None))


def test_quota_use_leaves_out_only_allocations_granted_before_the_horizon() -> None:
    allocs = [allocation("old-live", OLD, None), allocation("new-live", NEW, None)]
    found = kinds(invariants.quota_use(Snapshot(stores={}, streams=None), placement(allocs, [], HORIZON)))
    assert found == {("use_differs_from_events", "t/H100")}  # new-live's grant event is missing: 1 GPU, not 2
    clean = placement(allocs, [("new-live", "granted")], HORIZON)
    assert kinds(invariants.quota_use(Snapshot(stores={}, streams=None), clean)) == set()
    assert kinds(invariants.quota_use(Snapshot(stores={}, streams=None),
                                      placement(allocs, [("new-live", "granted")], None))) != set()


def accounting(allocs: list[dict[str, Any]], inbox_horizon: datetime | None) -> ServiceStore:
    """Ledger rows for every allocation, and an inbox that remembers none of their events (all pruned)."""
    store = ServiceStore("accounting", NOW, inbox_pruned_before=inbox_horizon)
    store.tables["gpu_intervals"] = [{"allocation_id": a["allocation_id"], "slot": 0,
                                      "gpu_uuid": f"gpu-{a['allocation_id']}", "share_milli": 1000, "team": "t",
                                      "gpu_model": "H100", "granted_at": a["granted_at"],
                                      "released_at": a["released_at"]} for a in allocs]
    return store


def test_the_ledger_skips_allocations_before_any_horizon_it_depends_on() -> None:
    allocs = [allocation("old", OLD, OLD + timedelta(hours=1)), allocation("new", NEW, NEW + timedelta(minutes=5))]
    inbox_horizon = NOW - timedelta(days=30)
    # only accounting's inbox was pruned: placement still has every event
    events = [(a["allocation_id"], k) for a in allocs for k in ("granted", "released")]
    assert kinds(invariants.ledger(accounting(allocs, inbox_horizon), placement(allocs, events, None))) == {
        ("ledger_ahead_of_events", "new")}
    assert kinds(invariants.ledger(accounting(allocs, None), placement(allocs, events, None))) == {
        ("ledger_ahead_of_events", "new"), ("ledger_ahead_of_events", "old")}


def test_maybe_pruned_leaves_a_minute_of_clock_slack_after_the_horizon() -> None:
    assert not invariants.maybe_pruned(None, OLD)
    assert invariants.maybe_pruned(HORIZON, HORIZON - timedelta(seconds=1))
    assert invariants.maybe_pruned(HORIZON, HORIZON + timedelta(seconds=30))
    assert not invariants.maybe_pruned(HORIZON, HORIZON + timedelta(minutes=2))
