"""Placement turns wanted jobs into the core's schedulable units: a whole job, a gang, or each missing replica."""

from __future__ import annotations

from datetime import UTC, datetime

from services.placement.domain import build_requests, split_unit, unit_id

T0 = datetime(2026, 11, 30, tzinfo=UTC)


def wanted(job_id: str, **over):  # type: ignore[no-untyped-def]
    base = {"job_id": job_id, "team": "research", "project": "default", "gpus": 1, "gpu_models": [], "priority": 0,
            "priority_class": "normal", "kind": "batch", "submitted_at": T0, "gang_nodes": 0, "gpus_per_node": 0,
            "replicas": 1, "max_runtime_s": None}
    return {**base, **over}


def test_a_single_job_is_one_unit_until_it_holds_gpus() -> None:
    assert [r.job_id for r in build_requests([wanted("a")], {})] == ["a"]
    assert build_requests([wanted("a")], {"a": {0}}) == []


def test_a_gang_is_one_unit_with_its_shape() -> None:
    [req] = build_requests([wanted("g", gpus=16, gang_nodes=2, gpus_per_node=8)], {})
    assert (req.job_id, req.gang_nodes, req.gpus_per_node, req.gpus) == ("g", 2, 8, 16)


def test_a_replicated_job_asks_only_for_its_missing_replicas() -> None:
    requests = build_requests([wanted("svc", replicas=4, kind="inference")], {"svc": {0, 2}})
    assert [r.job_id for r in requests] == ["svc#1", "svc#3"]
    assert all(r.kind == "inference" and r.gpus == 1 for r in requests)


def test_unit_ids_round_trip() -> None:
    assert split_unit(unit_id("svc", 3, replicas=4)) == ("svc", 3)
    assert split_unit(unit_id("job", 0, replicas=1)) == ("job", None)


def test_declared_max_runtime_reaches_the_core() -> None:
    [req] = build_requests([wanted("b", max_runtime_s=600.0)], {})
    assert req.max_runtime_s == 600.0
