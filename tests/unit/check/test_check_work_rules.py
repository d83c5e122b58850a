"""gpupool check on the work the agents run: GPUs that ran work go back only once the agent reported the work's
cgroup empty (the release then carries the exit), and work being stopped keeps its GPUs until then."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from libs.check import invariants
from libs.check.snapshot import ServiceStore

NOW = datetime(2026, 12, 1, 12, tzinfo=UTC)


def stores(allocation: dict, *, state: str = "completed", finished: bool = True) -> tuple[ServiceStore, ServiceStore]:
    q = ServiceStore("queue", NOW)
    q.tables["jobs"] = [{"job_id": "j", "state": state, "allocation_id": "a", "replicas": 1, "gang_nodes": 0}]
    q.tables["job_history"] = []
    p = ServiceStore("placement", NOW)
    p.tables["allocations"] = [{"allocation_id": "a", "job_id": "j", "replica": 0, "released_at": None,
                                "release_reason": None, "work": True, "preempt_deadline": None, "exited": False,
                                **allocation}]
    p.tables["finished_jobs"] = [{"job_id": "j"}] if finished else []
    p.tables["pending_jobs"] = []
    return q, p


def kinds(q: ServiceStore, p: ServiceStore) -> set[str]:
    return {v.kind for v in invariants.job_placement(q, p)[1]}


def test_work_released_with_its_exit_is_clean() -> None:
    assert kinds(*stores({"released_at": NOW, "release_reason": "WorkCompleted", "exited": True})) == set()


def test_work_released_without_an_exit_is_a_violation_unless_its_node_was_lost() -> None:
    released = {"released_at": NOW, "release_reason": "JobCancelled"}
    assert "work_released_before_exit" in kinds(*stores(released))
    assert kinds(*stores({**released, "release_reason": "NodeLost"})) == set()
    # an allocation without work is released at once, as always
    assert kinds(*stores({**released, "work": False})) == set()


def test_a_finished_job_may_hold_gpus_only_while_its_work_is_being_stopped() -> None:
    stopping = {"preempt_deadline": NOW + timedelta(seconds=5)}
    assert "finished_job_holds_gpus" not in kinds(*stores(stopping, state="cancelled"))
    assert "finished_job_holds_gpus" in kinds(*stores({}, state="cancelled"))
    assert "finished_job_holds_gpus" in kinds(*stores({**stopping, "work": False}, state="cancelled"))
