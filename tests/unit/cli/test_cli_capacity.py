"""`gpupool report capacity --what-if` and `gpupool history export`, client-side parts: the target's syntax, the
history's jobs as trace rows, and the what-if over a history file on a small pool."""

from __future__ import annotations

from pathlib import Path

import pytest

from libs.cli.capacity import parse_what_if, trace_rows, what_if, what_if_text
from libs.cli.common import UsageError
from libs.core.model import Gpu, Node
from libs.sim.traces import read_history, write_history


def item(job_id: str, submit: float, duration: float | None, gpus: int = 2, **kw: object) -> dict:
    return {"job_id": job_id, "team": "research", "project": "default", "kind": "training", "priority": 0,
            "priority_class": "normal", "gpus": gpus, "gpu_models": ["H100-80GB"], "gpu_fraction_milli": 0,
            "mig_profile": "", "gang_nodes": 0, "gpus_per_node": 0, "replicas": 1, "max_runtime_s": None,
            "submit_time": submit, "start_time": submit if duration is not None else None, "end_time": None,
            "duration_s": duration, "wait_s": 0.0 if duration is not None else None,
            "gpu_model_granted": "H100-80GB" if duration is not None else None,
            "state": "ended" if duration is not None else "cancelled", **kw}


@pytest.mark.parametrize(("text", "seconds"), [("p90-wait=600", 600.0), ("p90-wait=10m", 600.0),
                                               ("p90-wait=1.5", 1.5)])
def test_what_if_targets(text: str, seconds: float) -> None:
    assert parse_what_if(text) == seconds


@pytest.mark.parametrize("text", ["p50-wait=600", "p90-wait=", "600", "p90-wait=soon"])
def test_bad_what_if_targets_are_usage_errors(text: str) -> None:
    with pytest.raises(UsageError):
        parse_what_if(text)


def test_trace_rows_expand_replicas_and_leave_out_jobs_that_never_ran() -> None:
    rows, skipped = trace_rows([item("a", 1.0, 5.0, replicas=2, gpus=1),
                                item("b", 2.0, None), item("c", 3.0, None, state="waiting")])
    assert [(r["job_id"], r["replica_group"]) for r in rows] == [("a#r0", "a"), ("a#r1", "a")]
    assert rows[0]["gpu_model"] == "H100-80GB" and rows[0]["duration"] == 5.0
    assert dict(skipped) == {"cancelled": 1, "waiting": 1}


def test_what_if_on_a_history_file_finds_the_smallest_pool(tmp_path: Path) -> None:
    nodes = [Node(f"n{i}", "c", tuple(Gpu(f"n{i}/g{k}", k, "H100-80GB", 81920) for k in range(2))) for i in range(2)]
    rows, _ = trace_rows([item(f"j{i}", 1000.0, 100.0) for i in range(8)])
    path = tmp_path / "h.csv"
    write_history(path, rows)
    assert len(read_history(path)[0]) == 8
    result = what_if(nodes, path, 150.0, None)
    (h100,) = result["models"]
    assert (h100["gpus_now"], h100["answer"]["gpus"], h100["answer"]["p90_wait_s"]) == (4, 8, 100.0)
    assert [(t["gpus"], t["p90_wait_s"]) for t in h100["trials"]] == [(4, 300.0), (6, 200.0), (8, 100.0)]
    text = what_if_text(result)
    assert "H100-80GB: 8 GPUs (4 nodes; today 4)" in text
    with pytest.raises(UsageError):
        what_if(nodes, path, 150.0, ["L40S"])
