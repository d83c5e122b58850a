"""A request's alternative shares: tried in order when the request as asked is not placed now (a dev session on a
MIG slice, or a whole GPU, when every fractional GPU is full)."""

from __future__ import annotations

from core_builders import job, node, running, snapshot

from libs.core import Policy, schedule, teams_quota
from libs.core.model import Share

MIG_SLICE = Share(mig_profile="1g.10gb", gpu_models=("A100-80GB",))
ALTERNATIVES = (MIG_SLICE, Share())


def _pool():
    return (node("frac", 1, model="L40S", memory_mib=46068, sharing="fractional"),
            node("mig", 1, model="A100-80GB", sharing="mig"),
            node("whole", 1, model="L40S", memory_mib=46068))


def _dev(job_id: str, **kw):
    return job(job_id, 1, kind="dev", gpu_fraction_milli=500, gpu_memory_mib=8192, alternatives=ALTERNATIVES, **kw)


def test_a_fraction_first_then_a_mig_slice_then_a_whole_gpu_when_the_fractions_are_full():
    busy = [running("held", "frac", [0], gpu_fraction_milli=800, gpu_memory_mib=30000)]
    plan = schedule(snapshot(_pool(), running=busy), [_dev("d1"), _dev("d2"), _dev("d3")], Policy(), now=10.0)
    got = {p.job_id: (p.node, p.gpu_fraction_milli, p.mig.profile if p.mig else "") for p in plan.placements}
    assert got == {"d1": ("mig", 0, "1g.10gb"), "d2": ("mig", 0, "1g.10gb"), "d3": ("mig", 0, "1g.10gb")}
    # with room on the fractional GPU, the request as asked wins
    plan = schedule(snapshot(_pool()), [_dev("d1")], Policy(), now=10.0)
    assert [(p.node, p.gpu_fraction_milli) for p in plan.placements] == [("frac", 500)]


def test_the_last_alternative_is_a_whole_gpu_and_the_reason_stays_the_requests_own():
    busy = [running("held", "frac", [0], gpu_fraction_milli=800, gpu_memory_mib=30000)]
    pool = [n for n in _pool() if n.name != "mig"]  # no MIG GPU at all: that alternative is skipped
    plan = schedule(snapshot(pool, running=busy), [_dev("d1"), _dev("d2")], Policy(), now=10.0)
    assert [(p.job_id, p.node, p.gpu_fraction_milli) for p in plan.placements] == [("d1", "whole", 0)]
    waiting = plan.reason_of("d2")
    assert waiting.reason == "NoFeasibleNode" and "0.5 of a shareable GPU" in waiting.message, waiting


def test_an_alternative_is_admitted_by_its_own_quota_amount():
    # the team may hold 0.2 GPU: the 500-milli fraction is over quota, a 1g.10gb slice (1/7) is not
    quotas = teams_quota({"team-a": 0.2}, borrowing_limit=0)
    plan = schedule(snapshot(_pool()), [_dev("d1")], Policy(quotas=quotas), now=10.0)
    [placed] = plan.placements
    assert placed.mig is not None and placed.mig.profile == "1g.10gb"


def test_alternatives_are_only_for_a_one_gpu_request():
    plan = schedule(snapshot(_pool()), [job("two", 2, alternatives=(Share(),))], Policy(), now=10.0)
    assert plan.reason_of("two").reason == "InvalidRequest"
    bad = job("bad", 1, alternatives=(Share(gpu_fraction_milli=100, mig_profile="1g.10gb"),))
    assert schedule(snapshot(_pool()), [bad], Policy(), now=10.0).reason_of("bad").reason == "InvalidRequest"


def test_a_request_no_model_can_serve_still_runs_on_an_alternative_and_has_no_reason_left():
    asked = job("d1", 1, kind="dev", gpu_fraction_milli=500, gpu_memory_mib=8192, gpu_models=("V100-32GB",),
                alternatives=ALTERNATIVES)  # no V100 in this pool
    plan = schedule(snapshot(_pool()), [asked], Policy(), now=10.0)
    assert [p.node for p in plan.placements] == ["mig"] and plan.reason_of("d1") is None
