"""A recorded cycle can be scheduled again to the same plan: the codec round-trips every core value exactly."""

from __future__ import annotations

import math

import pytest

from libs.core import (
    Allocation,
    Gpu,
    JobRequest,
    MigInstance,
    Node,
    Policy,
    QuotaEntry,
    QuotaTree,
    Reservation,
    Snapshot,
    UsageRecord,
    schedule,
)
from libs.core.codec import CodecError, decode, dumps, encode, loads, plan_digest


def cycle_inputs():  # type: ignore[no-untyped-def]
    gpus = tuple(Gpu(f"G{i}", i, "H100-80GB", 81920, nvlink_domain="nv0") for i in range(4))
    mig_gpu = Gpu("M0", 4, "A100-80GB", 81920, sharing="mig", mig_instances=(MigInstance("3g.40gb", 0),))
    snapshot = Snapshot(
        nodes=(Node("n1", "c", gpus + (mig_gpu,), labels=(("zone", "a"),), topology="rack-1"),),
        allocated_gpus=frozenset({"G3"}),
        running=(Allocation("old", "b", "n1", ("G0",), started_at=1.0, priority_class="low", max_runtime_s=50.0),),
        usage=(UsageRecord("b", "H100-80GB", 3600.0, as_of=0.0),),
    )
    pending = (JobRequest("j1", "a", 2, submitted_at=5.0), JobRequest("j2", "b", 1, submitted_at=6.0,
                                                                     mig_profile="1g.10gb"),
               JobRequest("j3", "a", 4, submitted_at=7.0))
    policy = Policy(quotas=QuotaTree((QuotaEntry("default/a", guaranteed=2, borrowing_limit=10.0),)))
    return snapshot, pending, policy


def test_core_values_round_trip_exactly() -> None:
    snapshot, pending, policy = cycle_inputs()
    for value in (snapshot, pending, policy, schedule(snapshot, pending, policy, now=100.0),
                  Reservation("gang", ("n1", "n2"), start_by=math.inf)):
        assert loads(dumps(value)) == value


def test_a_decoded_cycle_schedules_to_the_same_plan() -> None:
    snapshot, pending, policy = cycle_inputs()
    recorded = dumps({"snapshot": snapshot, "pending": pending, "policy": policy, "now": 100.0})
    original = schedule(snapshot, pending, policy, now=100.0)
    inputs = loads(recorded)
    again = schedule(inputs["snapshot"], inputs["pending"], inputs["policy"], now=inputs["now"])
    assert plan_digest(again) == plan_digest(original)
    assert again.placements and again.pending  # the example decides something both ways


def test_the_digest_changes_when_the_decision_changes() -> None:
    snapshot, pending, policy = cycle_inputs()
    a = schedule(snapshot, pending, policy, now=100.0)
    b = schedule(snapshot, pending[:1], policy, now=100.0)
    assert plan_digest(a) != plan_digest(b)


def test_unknown_types_and_fields_are_refused() -> None:
    with pytest.raises(CodecError, match="unknown core type"):
        decode({"@": "Os", "path": "/"})
    doc = encode(JobRequest("j", "a", 1, submitted_at=0.0))
    doc["surprise"] = 1
    with pytest.raises(CodecError, match="surprise"):
        decode(doc)
