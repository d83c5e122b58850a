"""A cycle's pending reasons against the last one's (services/placement/reasons.py): an unchanged reason is the last
plan's very object (`libs.core.answers.SameAnswers`), only rows that changed are written for `explain` (`ReasonRows`), all of them
again after `forget`, and the rows are what `domain.pending_reasons` and `domain.pending_facts` say."""

from __future__ import annotations

from libs.core import Gpu, JobRequest, Node, PendingReason, Plan, Policy, Snapshot, schedule
from libs.core.answers import SameAnswers
from libs.core.plan import ReasonFacts
from libs.core.reasons import NO_NODE_MATCHES_SELECTOR
from services.placement.domain import ISOLATION_LABEL_PREFIX, pending_facts, pending_reasons
from services.placement.reasons import ReasonRows, same_reasons


def _node(name: str, gpus: int = 2) -> Node:
    return Node(name, "c", tuple(Gpu(f"{name}-g{i}", i, "H100", 81_920) for i in range(gpus)))


def _backlog() -> tuple[Snapshot, list[JobRequest]]:
    snap = Snapshot((_node("a"),), frozenset(), (), ())
    jobs = [JobRequest(f"j{i}", team="t", gpus=4, submitted_at=float(i)) for i in range(5)]  # never fit
    jobs.append(JobRequest("s", team="t", gpus=1, submitted_at=9.0, node_selector=((ISOLATION_LABEL_PREFIX + "sandbox",
                                                                                    "true"),)))
    return snap, jobs


def _plan(*reasons: PendingReason) -> Plan:
    return Plan(placements=(), pending=tuple(reasons))


def _same(answers: SameAnswers, *reasons: PendingReason) -> Plan:
    """A plan of `reasons` as a core given `answers` makes it: each unchanged one last cycle's object."""
    out = tuple(answers.same(r) for r in reasons)
    answers.turn(out)
    return _plan(*out)


def test_only_changed_rows_are_written_and_a_reset_writes_all() -> None:
    facts = ReasonFacts(cause="no_room", ask="1 GPU")
    rows = ReasonRows()
    same = SameAnswers()
    plan = _same(same, PendingReason("a", "NoFeasibleNode", "full", facts),
                 PendingReason("b", "NoFeasibleNode", "full", facts))
    now = rows.rows(plan.pending, (), None)
    assert [c[0] for c in rows.changed(now)] == ["a", "b"]  # nothing written yet: all
    rows.committed(now)

    plan = _same(same, PendingReason("a", "NoFeasibleNode", "full", ReasonFacts(cause="no_room", ask="1 GPU")),
                 PendingReason("b", "QuotaExceeded", "over quota", ReasonFacts(cause="quota")))
    now = rows.rows(plan.pending, (), None)
    changed = rows.changed(now)
    assert changed == [("b", "QuotaExceeded", "over quota", now["b"][2])]  # a's is unchanged: not written
    assert '"cause":"quota"' in now["b"][2].replace(" ", "")
    rows.committed(now)
    assert rows.changed(rows.rows(plan.pending, (), None)) == []

    rows.forget()  # another replica may have written meanwhile
    assert [c[0] for c in rows.changed(rows.rows(plan.pending, (), None))] == ["a", "b"]


def test_a_failed_cycle_leaves_the_written_rows_as_they_were() -> None:
    rows = ReasonRows()
    first = rows.rows(_plan(PendingReason("a", "NoFeasibleNode", "full")).pending, (), None)
    rows.committed(first)
    rows.rows(_plan(PendingReason("a", "QuotaExceeded", "over")).pending, (), None)  # never committed
    again = rows.rows(_plan(PendingReason("a", "QuotaExceeded", "over")).pending, (), None)
    assert [c[0] for c in rows.changed(again)] == ["a"]


def test_rows_are_what_explain_shows_per_job_with_backoff_reasons_on_top() -> None:
    snap, jobs = _backlog()
    plan = schedule(snap, jobs, Policy(), now=0.0)
    assert any(r.reason == NO_NODE_MATCHES_SELECTOR for r in plan.pending)
    replicas = _plan(PendingReason("svc#0", "NoFeasibleNode", "first"),
                     PendingReason("svc#1", "NoFeasibleNode", "last", ReasonFacts(cause="no_room")))
    pending = plan.pending + replicas.pending
    rows = ReasonRows().rows(pending, jobs, snap.nodes, {"back": ("CrashLoopBackOff", "waits")})
    shown, facts = pending_reasons(pending, jobs, snap.nodes), pending_facts(pending)
    assert rows == {**{j: (*rm, facts[j]) for j, rm in shown.items()}, "back": ("CrashLoopBackOff", "waits", None)}
    assert rows["s"][0] == "NoNodeOffersIsolation" and rows["svc"][1] == "last"


def test_same_reasons_compares_job_reason_and_message_in_order() -> None:
    a, b = PendingReason("a", "R", "m"), PendingReason("b", "R", "m")
    assert same_reasons((a, b), (a, b)) and same_reasons((a,), (PendingReason("a", "R", "m", ReasonFacts("x")),))
    assert not same_reasons((a, b), (b, a)) and not same_reasons((a,), None) and not same_reasons((a,), (a, b))
    assert not same_reasons((a,), (PendingReason("a", "R", "other"),))


def test_the_rows_give_the_queue_order_each_job_once_in_the_plans_order() -> None:
    from services.placement.domain import queue_order

    rows = ReasonRows()
    pending = (PendingReason("s#1", "X", "m"), PendingReason("a", "X", "m"), PendingReason("s#0", "Y", "m"),
               PendingReason("b", "X", "m"))
    for _ in range(2):  # fresh rows, then the same objects again
        got = rows.rows(pending, (), None, {"backing-off": ("ReplicaBackingOff", "later")})
        assert rows.order == queue_order(pending) == ("s", "a", "b")
        assert list(got) == ["s", "a", "b", "backing-off"]  # a job backing off has a row, not a place
