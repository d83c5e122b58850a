"""Fairness over time windows (`metrics.ShareWindows`): each team's GPU time against its entitlement (its
guarantee, or its demand when it wants less) per window, and the reclaim churn a replay reports."""

from __future__ import annotations

import dataclasses

import pytest
from sim_builders import node_list, openb_tasks

from libs.sim import engine, traces
from libs.sim.metrics import ShareWindows


def test_a_team_held_below_its_guarantee_shows_in_the_window_it_waited():
    w = ShareWindows({"a": 2.0, "b": 2.0}, window_s=100.0, t0=0.0)
    w.change(0.0, "a", wants=2.0, held=2.0)  # a gets all it is entitled to from the start
    w.change(0.0, "b", wants=2.0)
    w.change(50.0, "b", held=2.0)  # b waits half of the first window
    w.change(200.0, "b", wants=-1.0, held=-1.0)  # then wants (and holds) less than its guarantee: entitled to 1
    w.advance(300.0)
    s = w.summary(min_entitled_gpu_s=1.0)
    assert s["teams"]["a"] == {"windows": 3, "mean_ratio": 1.0, "worst_ratio": 1.0, "share_below": 0.0}
    assert s["teams"]["b"]["worst_ratio"] == pytest.approx(0.5)
    assert s["teams"]["b"]["share_below"] == pytest.approx(1 / 3, abs=1e-6)
    assert (s["windows"], s["worst_ratio"], s["share_below"]) == (6, pytest.approx(0.5), pytest.approx(1 / 6, abs=1e-6))
    assert s["mean_ratio"] == pytest.approx((5 + 0.5) / 6, abs=1e-6)


def test_borrowing_above_the_entitlement_counts_as_no_more_than_getting_it():
    w = ShareWindows({"a": 1.0, "b": 3.0}, window_s=10.0, t0=0.0)
    w.change(0.0, "a", wants=4.0, held=4.0)  # a borrows b's idle guarantee: entitled to 1, gets 4
    w.advance(10.0)
    s = w.summary(min_entitled_gpu_s=1.0)
    assert s["teams"] == {"a": {"windows": 1, "mean_ratio": 1.0, "worst_ratio": 1.0, "share_below": 0.0}}


def test_a_change_on_a_window_edge_lands_in_the_next_window():
    w = ShareWindows({"a": 1.0}, window_s=10.0, t0=5.0)
    w.change(5.0, "a", wants=1.0)
    w.change(15.0, "a", held=1.0)
    w.advance(25.0)
    assert {k: v["a"] for k, v in w.acc.items()} == {0: [0.0, 10.0], 1: [10.0, 10.0]}
    with pytest.raises(ValueError):
        ShareWindows({"a": 1.0}, window_s=0.0, t0=0.0)


def test_a_contended_replay_reports_reclaim_churn_and_windowed_fairness(tmp_path):
    nodes = traces.read_nodes(node_list(tmp_path / "nodes.csv", shapes=((8, "G2", 96000, 393216, 2),)))
    jobs = [dataclasses.replace(j, request=dataclasses.replace(j.request, submitted_at=j.submit / 50))
            for j in traces.openb_jobs(traces.read_tasks(openb_tasks(tmp_path / "t.csv", n=150)), seed=0)]
    m = engine.replay(nodes, jobs, "default", fair_window_s=600.0).metrics
    f = m["fair_share_windows"]
    assert f["window_s"] == 600.0 and f["windows"] > 0
    assert 0.0 <= f["worst_ratio"] <= f["mean_ratio"] <= 1.0
    assert set(f["teams"]) <= {f"team-{i}" for i in range(4)}
    reclaims = m["preemptions_by_reason"].get("ReclaimedForGuarantee", 0)
    assert m["reclaim_preemptions"] == reclaims
    assert m["work_lost_gpu_h"] >= m["reclaim_work_lost_gpu_h"] >= 0.0
    assert (m["work_lost_gpu_h"] > 0) == (m["preemptions"] > 0)
