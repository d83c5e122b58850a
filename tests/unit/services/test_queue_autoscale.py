"""A service's autoscaling rule (pure): ceil(load / target) within the bounds, scale-up to the lowest and
scale-down to the highest recommendation of their windows, a cool-down between steps, and no step without a fresh
report. And the bounds a job declares, checked at the edge."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from libs.contracts.autoscale import AutoscalePolicy
from libs.contracts.commands import SubmitJob
from services.queue.domain import autoscale, counted_sample, sampled_reporter

POLICY = AutoscalePolicy(target=10, scale_up_stabilization_s=0, scale_down_stabilization_s=30, cooldown_s=5,
                         sample_ttl_s=60)


def run(load: float | None, *, current: int, recs=(), last=None, now: float = 1000.0, policy=POLICY):  # type: ignore[no-untyped-def]
    samples = [] if load is None else [(load, now - 1)]
    return autoscale(policy, current=current, min_replicas=2, max_replicas=8, samples=samples,
                     recommendations=recs, last_scaled_at=last, now=now)


def test_load_over_target_scales_up_at_once_and_says_why() -> None:
    step = run(35, current=2)
    assert step.replicas == 4 and step.load == 35
    assert step.reason is not None and "load 35" in step.reason and "wants 4" in step.reason


def test_the_bounds_hold_both_ways() -> None:
    assert run(1000, current=2).replicas == 8
    assert run(0, current=3, now=2000).replicas == 2


def test_a_dip_shorter_than_the_down_window_does_not_scale_down() -> None:
    recs = [(980.0, 4), (990.0, 4)]
    held = run(5, current=4, recs=recs, now=1000)
    assert held.replicas == 4 and held.reason is None  # the window still remembers 4
    assert run(5, current=4, recs=held.recommendations, now=1015).replicas == 4  # 990's 4 is 25 s old
    later = run(5, current=4, recs=held.recommendations, now=1021)  # 980 and 990 have left the 30 s window
    assert later.replicas == 2 and later.reason is not None


def test_no_step_within_the_cooldown_nor_without_a_fresh_report() -> None:
    assert run(35, current=2, last=998).replicas == 2
    assert run(None, current=2).replicas == 2
    stale = autoscale(POLICY, current=2, min_replicas=2, max_replicas=8, samples=[(100, 900.0)], recommendations=(),
                      last_scaled_at=None, now=1000.0)
    assert stale.replicas == 2 and stale.reason is None


def test_reports_are_summed_and_old_recommendations_forgotten() -> None:
    step = autoscale(POLICY, current=2, min_replicas=2, max_replicas=8, samples=[(12, 999.0), (13, 999.5)],
                     recommendations=[(1.0, 7)], last_scaled_at=None, now=1000.0)
    assert step.replicas == 3 and step.recommendations == ((1000.0, 3),)


def test_an_up_window_takes_the_lowest_recent_recommendation() -> None:
    slow_up = POLICY.model_copy(update={"scale_up_stabilization_s": 10})
    assert run(80, current=2, recs=[(995.0, 3)], policy=slow_up).replicas == 3


def test_bounds_and_policy_are_checked_when_submitted() -> None:
    base = {"name": "svc", "team": "t", "gpus": 1, "kind": "inference"}
    ok = SubmitJob(**base, replicas=2, min_replicas=2, max_replicas=4, autoscale={"target": 5})
    assert ok.autoscale is not None and ok.autoscale.scale_down_stabilization_s == 300
    assert SubmitJob(**base, replicas=1, min_replicas=1, max_replicas=3, autoscale={"target": 5}).min_replicas == 1
    for bad, why in ((dict(replicas=5, min_replicas=2, max_replicas=4), "min_replicas <= replicas"),
                     (dict(replicas=2, autoscale={"target": 5}), "needs min_replicas and max_replicas"),
                     (dict(replicas=1, min_replicas=1, max_replicas=1, autoscale={"target": 5}), "room to scale"),
                     (dict(replicas=2, min_replicas=2, max_replicas=4, autoscale={"target": 0}), "greater than")):
        with pytest.raises(ValidationError, match=why):
            SubmitJob(**base, **bad)


SERVICE = {"name": "svc", "team": "t", "gpus": 1, "kind": "inference", "replicas": 2, "min_replicas": 2,
           "max_replicas": 4, "command": ["python3", "-m", "server"], "ports": ["http", "admin"]}


def test_a_sampled_signal_puts_its_probe_into_the_work_the_agents_run() -> None:
    gpu = SubmitJob(**SERVICE, autoscale={"signal": "gpu_utilization", "target": 60, "sample_every_s": 2})
    probe = gpu.work_spec().load  # type: ignore[union-attr]
    assert probe is not None and (probe.signal, probe.every_s, probe.metric) == ("gpu_utilization", 2, None)
    metric = SubmitJob(**SERVICE, autoscale={"signal": "metric", "metric": "vllm:num_requests_running",
                                             "metric_port": "admin", "target": 8})
    probe = metric.work_spec().load  # type: ignore[union-attr]
    assert probe is not None and (probe.metric, probe.port, probe.path) == ("vllm:num_requests_running", "admin",
                                                                            "/metrics")
    default_port = SubmitJob(**SERVICE, autoscale={"signal": "metric", "metric": "inflight", "target": 8})
    assert default_port.work_spec().load.port == "http"  # type: ignore[union-attr]
    pushed = SubmitJob(**SERVICE, autoscale={"target": 8})
    assert pushed.work_spec().load is None  # type: ignore[union-attr]


def test_a_sampled_signal_is_refused_where_nothing_can_sample_it() -> None:
    commandless = {k: v for k, v in SERVICE.items() if k not in ("command", "ports")}
    portless = {k: v for k, v in SERVICE.items() if k != "ports"}
    for fields, policy, why in (
            (commandless, {"signal": "gpu_utilization", "target": 50}, "needs a command"),
            (portless, {"signal": "metric", "metric": "inflight", "target": 5}, "needs the work's ports"),
            (SERVICE, {"signal": "metric", "metric": "inflight", "metric_port": "grpc", "target": 5}, "among them"),
            (SERVICE, {"signal": "metric", "target": 5}, "needs one"),
            (SERVICE, {"signal": "load", "metric": "inflight", "target": 5}, "goes with signal metric"),
            (SERVICE, {"signal": "gpu_utilization", "target": 150}, "at most 100"),
            (SERVICE, {"signal": "gpu_utilization", "target": 50, "sample_every_s": 60, "sample_ttl_s": 30},
             "shorter than sample_ttl_s"),
            (SERVICE, {"signal": "metric", "metric": "bad name", "target": 5}, "pattern")):
        with pytest.raises(ValidationError, match=why):
            SubmitJob(**fields, autoscale=policy)


def test_only_the_replicas_the_job_has_now_count_for_a_sampled_signal() -> None:
    gpu = AutoscalePolicy(signal="gpu_utilization", target=50)
    assert [counted_sample(gpu, sampled_reporter(i), 2) for i in range(4)] == [True, True, False, False]
    assert not counted_sample(gpu, "replica-0", 2) and not counted_sample(gpu, "agent-replica-x", 2)
    assert counted_sample(POLICY, "anything", 1)  # a pushed load counts whoever reported it
    step = autoscale(gpu, current=2, min_replicas=2, max_replicas=8, samples=[(90.0, 999.0), (80.0, 999.0)],
                     recommendations=(), last_scaled_at=None, now=1000.0)
    assert step.replicas == 4 and step.reason is not None and step.reason.startswith("GPU utilisation"), step


def test_the_windows_never_turn_a_step_round() -> None:
    # CI saw 3 -> 2 on a load that wanted 4: the up window still held a 2 from before the load rose
    slow = POLICY.model_copy(update={"scale_up_stabilization_s": 2, "scale_down_stabilization_s": 3})
    rising = run(40, current=3, recs=[(999.0, 2)], policy=slow)
    assert rising.replicas == 3 and rising.reason is None
    falling = run(5, current=3, recs=[(999.0, 4)], policy=slow)  # wants 2, the down window holds 4: stay at 3
    assert falling.replicas == 3 and falling.reason is None
