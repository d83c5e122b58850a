"""A recorded decision's JSON comes from placement's DecisionEncoder, which reuses the encodings of items seen in
earlier cycles: its text (and so every digest) must be exactly what libs.core.codec writes, cycle after cycle."""

from __future__ import annotations

from datetime import UTC, datetime

from libs.core import codec, schedule
from services.placement.domain import build_policy, build_requests, build_snapshot
from services.placement.encoder import DecisionEncoder

T0 = datetime(2026, 11, 30, tzinfo=UTC)
GPUS = [{"uuid": f"G-{n}-{i}", "cluster": "c", "node": f"n{n}", "idx": i, "model": model, "memory_mib": mem,
         "health": "healthy" if (n, i) != (0, 7) else "failed", "sharing": sharing}
        for n, (model, mem, sharing) in enumerate([("H100", 81920, "exclusive"), ("L40S", 46068, "fractional"),
                                                    ("A100-80GB", 81920, "mig")]) for i in range(8)]
NODES = [{"cluster": "c", "node": f"n{n}", "schedulable": n != 3} for n in range(4)]


def running(k: int, node: int, **over):  # type: ignore[no-untyped-def]
    base = {"allocation_id": f"a{k}", "job_id": f"r{k}", "replica": 0, "team": "ml", "project": "p", "node": f"n{node}",
            "granted_at": T0, "priority": 100, "priority_class": "normal", "kind": "training",
            "preempt_deadline": None, "preempted_by": None, "max_runtime_s": 3600.0, "replicas": 1,
            "gpu_uuids": [f"G-{node}-{k}"], "gpu_model": GPUS[node * 8]["model"], "share_milli": 1000,
            "gpu_memory_mib": None, "mig_profiles": [None], "mig_starts": [None]}
    return {**base, **over}


def wanted(k: int, **over):  # type: ignore[no-untyped-def]
    base = {"job_id": f"j{k}", "team": ("ml", "cv")[k % 2], "project": "p", "gpus": 1 + k % 3, "gpu_models": [],
            "priority": k % 4 * 100, "priority_class": "", "kind": ("batch", "dev", "training")[k % 3],
            "submitted_at": T0, "gang_nodes": 0, "gpus_per_node": 0, "replicas": 1,
            "max_runtime_s": 600.0 if k % 2 else None, "gpu_fraction_milli": 0, "gpu_memory_mib": 0,
            "mig_profile": "", "exclusive": False}
    return {**base, **over}


def test_the_encoder_writes_exactly_what_the_codec_writes_across_cycles() -> None:
    enc = DecisionEncoder()
    policy = build_policy("default", [], [{"path": "org/ml", "gpu_model": "H100", "guaranteed": 4.0,
                                           "borrowing_limit": None, "lending_limit": 2.0, "weight": 1.0}],
                          [{"team": "ml", "org": "org"}], 300.0, 7 * 24 * 3600.0)
    runs = [running(0, 0), running(1, 0, replicas=3, replica=1),
            running(2, 1, share_milli=500, gpu_memory_mib=16384, kind="dev"),
            running(3, 2, mig_profiles=["1g.10gb"], mig_starts=[4], share_milli=142, kind="inference")]
    backlog = [wanted(k) for k in range(40)] + [wanted(40, gang_nodes=2, gpus_per_node=4, gpus=8),
                                                 wanted(41, replicas=3), wanted(42, mig_profile="3g.40gb")]
    cycles = [(runs, backlog), (runs[:2], backlog[5:]), ([], backlog[:3]), (runs, [])]
    for run, pend in cycles + cycles:  # the second round hits the encodings kept from the first
        snapshot = build_snapshot(NODES, GPUS, run)
        requests = build_requests(pend, {}, {"fractional": {"L40S"}, "mig": {"A100-80GB"}})
        plan = schedule(snapshot, requests, policy, now=1.8e9)
        expected = codec.dumps({"snapshot": snapshot, "pending": tuple(requests), "policy": policy, "now": 1.8e9})
        assert enc.input_json(snapshot, requests, policy, 1.8e9) == expected
        assert enc.plan_json(plan) == codec.dumps(plan)
        assert enc.plan_digest(plan) == codec.plan_digest(plan)
        assert codec.loads(enc.input_json(snapshot, requests, policy, 1.8e9))["snapshot"] == snapshot
        enc.turn()


def test_the_encoder_forgets_objects_no_cycle_uses_any_more() -> None:
    enc = DecisionEncoder()
    policy = build_policy("default", [], [], [], 300.0, 7 * 24 * 3600.0)
    snapshot = build_snapshot(NODES, GPUS, [])
    for c in range(30):  # every cycle a new backlog: the old requests must not pile up
        requests = build_requests([wanted(k) for k in range(c * 10, c * 10 + 10)], {},
                                  {"fractional": {"L40S"}, "mig": {"A100-80GB"}})
        assert enc.input_json(snapshot, requests, policy, 1.0) == codec.dumps(
            {"snapshot": snapshot, "pending": tuple(requests), "policy": policy, "now": 1.0})
        enc.turn()
        assert len(enc._ids) <= 2 * (len(snapshot.nodes) + len(requests)) + 1
