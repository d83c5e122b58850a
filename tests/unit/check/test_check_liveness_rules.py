"""The liveness rules (libs/check/liveness.py) on hand-built snapshots: a job the queue has wanted beyond the bound
must be known to placement and considered by a cycle; placement must have decided since the wanted jobs were
submitted; consumer lag says which consumer, how old, and what the message waits on."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

from libs.check import invariants, liveness
from libs.check.cli import build_parser, config_from_args
from libs.check.model import Report, Violation
from libs.check.snapshot import ConsumerState, OutboxRow, ServiceStore, StreamView
from libs.contracts import subjects

NOW = datetime(2026, 11, 30, 12, tzinfo=UTC)
BOUND = 60.0
OLD = NOW - timedelta(seconds=300)
YOUNG = NOW - timedelta(seconds=10)
_seq = iter(range(1, 10_000))


def row(subject: str, data: dict[str, Any], at: datetime, *, published: bool = True) -> OutboxRow:
    n = next(_seq)
    return OutboxRow(seq=n, event_id=f"e{n}", subject=subject, created_at=at,
                     published_at=at if published else None, attempts=3 if not published else 1, data=data)


def queue_with(job_id: str, at: datetime, *, requeue_at: datetime | None = None, published: bool = True,
               events: bool = True) -> tuple[ServiceStore, OutboxRow | None]:
    """A pending job whose state_changed (→ pending) and job.submitted the queue emitted at `at`."""
    q = ServiceStore("queue", NOW)
    q.tables["jobs"] = [{"job_id": job_id, "state": "pending", "submitted_at": at, "requeue_at": requeue_at}]
    if not events:
        return q, None
    q.outbox.append(row(subjects.JOB_STATE_CHANGED, {"job_id": job_id, "previous": None, "current": "pending",
                                                     "reason": "Submitted"}, at))
    sub = row(subjects.JOB_SUBMITTED, {"job_id": job_id}, at, published=published)
    q.outbox.append(sub)
    return q, sub


def placement_with(pending: list[dict[str, Any]], applied: set[str], latest: datetime | None = None,
                   finished: tuple[str, ...] = ()) -> ServiceStore:
    p = ServiceStore("placement", NOW + timedelta(milliseconds=5))
    p.tables["pending_jobs"] = [{"satisfied": False, "replicas": 1, "reason": None, **r} for r in pending]
    p.tables["finished_jobs"] = [{"job_id": j} for j in finished]
    p.tables["decisions"] = [{"latest": latest, "n": 0 if latest is None else 1}]
    p.inbox["placement"] = applied
    return p


def found(result: invariants.Result) -> set[tuple[str, str]]:
    return {(v.kind, v.subject) for v in result[1]}


# --- job_liveness ----------------------------------------------------------------------------------------------------
def test_a_job_placement_never_heard_of_after_the_bound_is_not_known_and_the_report_says_where_the_event_is() -> None:
    q, sub = queue_with("j", OLD)
    p = placement_with([], set())
    n, violations = liveness.job_liveness(q, p, BOUND)
    assert n == 1 and [(v.kind, v.subject) for v in violations] == [("job_not_known_to_placement", "j")]
    assert sub is not None and sub.event_id in violations[0].detail and "300.0s" in violations[0].detail
    assert "published at" in violations[0].detail and violations[0].data["age_s"] == 300.0
    q, _ = queue_with("j", OLD, published=False)
    (v,) = liveness.job_liveness(q, p, BOUND)[1]
    assert "still unpublished in the queue's outbox after 3 attempt(s)" in v.detail


def test_a_young_job_is_no_violation_whatever_placement_knows() -> None:
    q, _ = queue_with("j", YOUNG)
    assert found(liveness.job_liveness(q, placement_with([], set()), BOUND)) == set()
    assert found(liveness.job_liveness(q, placement_with([], set()), 5.0)) == {("job_not_known_to_placement", "j")}


def test_known_but_without_a_reason_is_never_considered_and_names_the_latest_decision() -> None:
    q, sub = queue_with("j", OLD)
    assert sub is not None
    p = placement_with([{"job_id": "j", "submitted_at": OLD}], {sub.event_id}, latest=NOW - timedelta(seconds=400))
    (v,) = liveness.job_liveness(q, p, BOUND)[1]
    assert (v.kind, v.subject) == ("job_never_considered", "j")
    assert "latest recorded decision is from 11:53:20" in v.detail, v.detail
    assert v.data["latest_decision_at"] == (NOW - timedelta(seconds=400)).isoformat()
    p = placement_with([{"job_id": "j", "submitted_at": OLD}], {sub.event_id})
    assert "no decision at all" in liveness.job_liveness(q, p, BOUND)[1][0].detail


def test_a_reason_or_a_placement_is_consideration() -> None:
    q, sub = queue_with("j", OLD)
    assert sub is not None
    for considered in ({"reason": "NoFeasibleNode"}, {"satisfied": True}):
        p = placement_with([{"job_id": "j", "submitted_at": OLD, **considered}], {sub.event_id})
        assert found(liveness.job_liveness(q, p, BOUND)) == set()


def test_a_row_from_an_earlier_submission_does_not_count_as_knowing_the_resubmission() -> None:
    """Requeued: placement still has the job's row (satisfied from its first placement), but never applied the
    job.submitted the queue emitted when it requeued it."""
    q, first = queue_with("j", OLD - timedelta(seconds=600))
    assert first is not None
    q.outbox.append(row(subjects.JOB_STATE_CHANGED, {"job_id": "j", "previous": "running", "current": "pending",
                                                     "reason": "Requeued:Preempted"}, OLD))
    again = row(subjects.JOB_SUBMITTED, {"job_id": "j"}, OLD)
    q.outbox.append(again)
    p = placement_with([{"job_id": "j", "submitted_at": OLD, "satisfied": True}], {first.event_id})
    (v,) = liveness.job_liveness(q, p, BOUND)[1]
    assert v.kind == "job_not_known_to_placement" and again.event_id in v.detail and "earlier submission" in v.detail
    p.inbox["placement"].add(again.event_id)
    p.tables["pending_jobs"][0]["satisfied"] = False  # what applying it does
    assert found(liveness.job_liveness(q, p, BOUND)) == {("job_never_considered", "j")}


def test_a_requeue_back_off_is_respected_and_an_overdue_one_is_reported() -> None:
    q, first = queue_with("j", OLD - timedelta(seconds=600))
    assert first is not None
    q.outbox.append(row(subjects.JOB_STATE_CHANGED, {"job_id": "j", "previous": "running", "current": "pending",
                                                     "reason": "Requeued:NodeLost"}, OLD))
    p = placement_with([{"job_id": "j", "submitted_at": OLD, "satisfied": True}], {first.event_id})
    q.tables["jobs"][0]["requeue_at"] = NOW + timedelta(seconds=120)  # still backing off
    assert liveness.job_liveness(q, p, BOUND) == (1, [])
    q.tables["jobs"][0]["requeue_at"] = NOW - timedelta(seconds=90)  # the sweep should have resubmitted it
    (v,) = liveness.job_liveness(q, p, BOUND)[1]
    assert (v.kind, v.subject) == ("job_not_submitted", "j") and "back-off ended at 11:58:30" in v.detail
    assert v.data["age_s"] == 90.0
    q.tables["jobs"][0]["requeue_at"] = NOW - timedelta(seconds=30)  # overdue, but within the bound
    assert liveness.job_liveness(q, p, BOUND) == (1, [])


def test_pending_without_a_submission_since_is_reported() -> None:
    q, first = queue_with("j", OLD - timedelta(seconds=600))
    q.outbox.append(row(subjects.JOB_STATE_CHANGED, {"job_id": "j", "previous": "running", "current": "pending",
                                                     "reason": "Requeued:Reclaimed"}, OLD))
    assert first is not None
    p = placement_with([{"job_id": "j", "submitted_at": OLD, "satisfied": True}], {first.event_id})
    (v,) = liveness.job_liveness(q, p, BOUND)[1]
    assert v.kind == "job_not_submitted" and "Requeued:Reclaimed" in v.detail


def test_finished_and_not_pending_jobs_are_not_judged() -> None:
    q, _ = queue_with("j", OLD)
    assert found(liveness.job_liveness(q, placement_with([], set(), finished=("j",)), BOUND)) == set()
    q.tables["jobs"][0]["state"] = "running"
    assert liveness.job_liveness(q, placement_with([], set()), BOUND) == (0, [])


def test_applied_but_not_wanted_is_left_to_job_placement() -> None:
    q, sub = queue_with("j", OLD)
    assert sub is not None
    assert found(liveness.job_liveness(q, placement_with([], {sub.event_id}), BOUND)) == set()


def test_with_its_events_pruned_the_job_is_judged_on_placements_row() -> None:
    q, _ = queue_with("j", OLD, events=False)
    q.outbox_pruned_before = NOW - timedelta(days=1)
    assert found(liveness.job_liveness(q, placement_with([], set()), BOUND)) == {("job_not_known_to_placement", "j")}
    ok = placement_with([{"job_id": "j", "submitted_at": OLD, "reason": "QuotaExceeded"}], set())
    assert found(liveness.job_liveness(q, ok, BOUND)) == set()
    waiting = placement_with([{"job_id": "j", "submitted_at": OLD}], set())
    assert found(liveness.job_liveness(q, waiting, BOUND)) == {("job_never_considered", "j")}


# --- scheduler_progress ----------------------------------------------------------------------------------------------
def test_a_stable_backlog_with_an_old_decision_is_progress() -> None:
    """Reasons that do not change are not recorded: the latest decision may be far older than the bound."""
    p = placement_with([{"job_id": "j", "submitted_at": OLD, "reason": "NoFeasibleNode"}], set(),
                       latest=OLD + timedelta(seconds=1))
    assert liveness.scheduler_progress(p, BOUND) == (1, [])


def test_jobs_submitted_after_the_latest_decision_are_a_stall() -> None:
    p = placement_with([{"job_id": "a", "submitted_at": OLD}, {"job_id": "b", "submitted_at": OLD + timedelta(seconds=5)},
                        {"job_id": "young", "submitted_at": YOUNG}, {"job_id": "placed", "submitted_at": OLD,
                                                                     "satisfied": True}],
                       set(), latest=OLD - timedelta(seconds=100))
    n, violations = liveness.scheduler_progress(p, BOUND)
    assert n == 2 and [(v.kind, v.subject) for v in violations] == [("no_decision_since_submission", "placement")]
    v = violations[0]
    assert v.data["jobs"] == 2 and v.data["oldest_job_id"] == "a" and v.data["job_ids"] == ["a", "b"]
    assert "oldest a" in v.detail and "11:53:20" in v.detail
    assert liveness.scheduler_progress(p, 400.0) == (0, [])  # within a looser bound nothing is old enough


def test_no_decision_ever_with_old_wanted_work_is_a_stall_and_nothing_pending_is_none() -> None:
    p = placement_with([{"job_id": "a", "submitted_at": OLD}], set())
    assert "no decision at all" in liveness.scheduler_progress(p, BOUND)[1][0].detail
    assert liveness.scheduler_progress(placement_with([], set()), BOUND) == (0, [])


def test_a_decision_a_little_before_the_submission_counts_for_clock_skew() -> None:
    p = placement_with([{"job_id": "a", "submitted_at": OLD}], set(), latest=OLD - timedelta(seconds=2))
    assert liveness.scheduler_progress(p, BOUND) == (1, [])


# --- consumer_lag ----------------------------------------------------------------------------------------------------
def consumer(**kw: Any) -> ConsumerState:
    base: dict[str, Any] = dict(stream="GPUPOOL_EVENTS", name="placement", filter_subjects=("gpupool.job.>",),
                                num_pending=3, num_ack_pending=0, num_redelivered=0, oldest_seq=41,
                                oldest_subject="gpupool.job.submitted", oldest_time=NOW - timedelta(seconds=90),
                                delivered_seq=40, num_waiting=0)
    return ConsumerState(**{**base, **kw})


def test_consumer_lag_names_the_consumer_its_age_and_what_the_message_waits_on() -> None:
    view = StreamView(read_at=NOW, consumers=[consumer()])
    (v,) = invariants.consumer_lag(view, BOUND)[1]
    assert v.subject == "GPUPOOL_EVENTS/placement" and "90.0s old" in v.detail
    assert "never delivered; no pull request is waiting: nobody is fetching" in v.detail
    assert v.data["consumer"] == "placement" and v.data["age_s"] == 90.0 and v.data["delivered"] is False
    view = StreamView(read_at=NOW, consumers=[consumer(delivered_seq=45, num_ack_pending=1, num_pending=0,
                                                       num_redelivered=2)])
    (v,) = invariants.consumer_lag(view, BOUND)[1]
    assert "delivered, never acknowledged" in v.detail and "2 redelivered" in v.detail
    assert invariants.consumer_lag(StreamView(read_at=NOW, consumers=[consumer()]), 120.0)[1] == []


# --- the command line --------------------------------------------------------------------------------------------------
def test_the_bounds_come_from_the_command_line_and_the_json_report_lists_the_new_checks() -> None:
    args = build_parser().parse_args(["--dsn", "queue=postgresql://x/q", "--pending-max-age", "12.5",
                                      "--decision-max-age", "30", "--only", "job_liveness,scheduler_progress"])
    config = config_from_args(args)
    assert (config.pending_max_age_s, config.decision_max_age_s) == (12.5, 30.0)
    defaults = config_from_args(build_parser().parse_args(["--dsn", "queue=postgresql://x/q"]))
    assert (defaults.pending_max_age_s, defaults.decision_max_age_s, defaults.lag_max_age_s) == (60.0, 60.0, 60.0)
    report = Report(violations=[Violation("job_liveness", "job_never_considered", "j", "why", {"age_s": 61.0})])
    doc = json.loads(report.to_json())
    assert doc["checks"]["job_liveness"]["violations"] == 1 and doc["checks"]["scheduler_progress"]["violations"] == 0
    assert doc["violations"][0]["data"] == {"age_s": 61.0} and doc["violations"][0]["subject"] == "j"


def inventory_with(*nodes: dict[str, Any]) -> ServiceStore:
    inv = ServiceStore("inventory", NOW)
    inv.tables["node_samples"] = [{"cluster": "c1", "state": "ready", "registered_at": OLD, "last_seen_at": OLD,
                                   "gpus": 8, **n} for n in nodes]
    return inv


def test_a_ready_node_without_a_fresh_sample_is_reported() -> None:
    """A fresh machine's CI waited 60 s for samples that never reached /v1/nodes; nothing said why."""
    inv = inventory_with({"node": "fresh", "latest_sample": YOUNG}, {"node": "never", "latest_sample": None},
                         {"node": "stale", "latest_sample": OLD},
                         {"node": "new", "registered_at": YOUNG, "latest_sample": None},  # within its bound
                         {"node": "gone", "state": "lost", "latest_sample": OLD},  # inventory knows: not here
                         {"node": "cpu-only", "gpus": 0, "latest_sample": None})
    checked, violations = liveness.telemetry_liveness(inv, BOUND)
    assert checked == 3
    assert [(v.kind, v.subject) for v in violations] == [("no_fresh_sample", "c1/never"),
                                                        ("no_fresh_sample", "c1/stale")]
    assert "no sample of its GPUs was ever stored" in violations[0].detail
    assert "300.0s ago" in violations[1].detail and violations[1].data["bound_s"] == BOUND


def test_the_telemetry_bound_is_a_flag() -> None:
    config = config_from_args(build_parser().parse_args(["--telemetry-max-age", "15", "--database-url",
                                                         "postgresql://x@127.0.0.1/postgres"]))
    assert config.telemetry_max_age_s == 15
