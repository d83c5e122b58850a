"""The `gpupool run -- true` benchmark's pure parts: percentiles, phases, the CLI's job id, the report."""

from __future__ import annotations

import math

from libs.bench.run import (
    BEGIN,
    END,
    Events,
    cli_job_id,
    fleet_gpus,
    markdown,
    ms,
    ratio,
    spans,
    summarize,
    summarize_spans,
)


def s(p50: float, p99: float, n: int = 10) -> dict:
    return {"n": n, "p50": p50, "p99": p99, "max": p99, "mean": p50}


def test_summary_interpolates_percentiles_and_is_nan_when_empty() -> None:
    out = summarize([0.4, 0.1, 0.3, 0.2, 0.5])
    assert out["n"] == 5 and out["p50"] == 0.3 and out["max"] == 0.5
    assert math.isclose(out["p99"], 0.496) and math.isclose(out["mean"], 0.3)
    empty = summarize([])
    assert empty["n"] == 0 and math.isnan(empty["p50"]) and math.isnan(empty["max"])


def test_phases_come_from_the_marks_seen_and_skip_the_missing() -> None:
    marks = {"submit": 10.0, "granted": 10.05, "started": 10.12, "exited": 10.13, "released": 10.14}
    got = spans(marks)
    assert math.isclose(got["granted_started"], 0.07) and math.isclose(got["submit_released"], 0.14)
    assert set(spans({"submit": 1.0, "granted": 1.5})) == {"submit_granted"}
    summary = summarize_spans([spans(marks), spans({"submit": 0.0, "granted": 0.1})], ("submit_granted",
                                                                                       "submit_started"))
    assert summary["submit_granted"]["n"] == 2 and summary["submit_started"]["n"] == 1


def test_events_keep_the_first_copy_of_each_mark_and_the_release_reason() -> None:
    ev = Events()
    ev.on("gpupool.agent.work_started", {"job_id": "j1"}, 5.0)
    ev.on("gpupool.agent.work_started", {"job_id": "j1"}, 6.0)  # a redelivery
    ev.on("gpupool.allocation.released", {"job_id": "j1", "reason": "WorkCompleted"}, 7.0)
    ev.on("gpupool.agent.telemetry", {"job_id": "j1"}, 8.0)  # not a mark
    assert ev.job("j1", submit=4.0) == {"submit": 4.0, "started": 5.0, "released": 7.0}
    assert ev.released == {"j1": "WorkCompleted"}


def test_the_executors_own_record_of_the_process_comes_with_the_exit() -> None:
    ev = Events()
    ev.offset = 1000.0  # wall clock = monotonic + 1000
    ev.on("gpupool.agent.work_exited", {"job_id": "j2", "exit": {
        "reason": "Completed", "started_at": "1970-01-01T00:16:50.000000Z",
        "exited_at": "1970-01-01T00:16:50.004000Z"}}, 20.0)
    ev.on("gpupool.agent.work_started", {"job_id": "j2"}, 20.5)  # the start report arrived after the exit's
    ev.on("gpupool.allocation.released", {"job_id": "j2", "reason": "WorkCompleted",
                                          "exit": {"reason": "Completed"}}, 21.0)
    got = spans(ev.job("j2", submit=9.9))
    assert math.isclose(got["submit_ran"], 0.1) and math.isclose(got["ran_ended"], 0.004, abs_tol=1e-6)
    assert math.isclose(got["started_exited"], -0.5) and math.isclose(got["ran_started"], 10.5)
    assert ev.released == {"j2": "WorkCompleted (Completed)"}
    assert ms(-0.0001) == "0 ms" and ms(-0.02) == "-20 ms" and ms(float("nan")) == "–"


def test_the_cli_job_id_is_read_from_its_status_line() -> None:
    err = "gpupool: submitted job 01a2-ff (run-true, 1 GPU(s)); Ctrl-C cancels it\ngpupool: job 01a2-ff is pending\n"
    assert cli_job_id(err) == "01a2-ff"
    assert cli_job_id("gpupool: error") is None


def test_ratio_and_fleet() -> None:
    assert ratio(0.1, 0.3) == "gpupool 3.0x faster"
    assert ratio(0.2, 0.1) == "gpupool 2.0x slower"
    assert ratio(float("nan"), 0.1) == "–"
    assert fleet_gpus("H100-80GB*8;H100-80GB*8;A100-80GB*4,L40S*2") == (3, 22)


def run(cli: float, srun: float | None, started10: int = 10) -> dict:
    cycle = {k: s(v, 2 * v) for k, v in (("submit_granted", 0.04), ("granted_started", 0.06),
                                          ("started_exited", 0.01), ("exited_released", 0.01),
                                          ("submit_started", 0.10), ("submit_released", 0.12))}
    paced = {"offered": 10, "submitted": 10, "errors": 0, "error_examples": [], "submitted_per_s": 10.0,
             "started": started10, "started_per_s": 9.5, "steady_per_s": 9.8, "released": started10, "completed": started10,
             "busy_pct": 80.0, "drain_s": 30.0, "submit_granted": s(0.05, 0.1), "submit_started": s(0.15, 0.3),
             "submit_ran": s(0.12, 0.25), "release_reasons": {"WorkCompleted (Completed)": started10},
             "submit_released": s(0.17, 0.35)}
    out: dict = {"load": [1.0, 1.2, 1.1], "busy_before_pct": 3.0, "gpupool": {
        "cycle": {**cycle, "failures": 0, "failure_examples": []},
        "cli": {"wall": s(cli, cli + 0.2), "spawn_started": s(0.6, 0.7), "spawn_released": s(1.0, 1.2),
                "released_exit": s(0.7, 1.0), "startup": s(0.5, 0.6), "failures": 0, "failure_examples": []},
        "paced": {"10": paced}}}
    if srun is not None:
        out["slurm"] = {"srun": {**s(srun, srun * 2), "failures": 0}, "paced": {"10": {
            "offered": 10, "submitted": 10, "started": 10, "submitted_per_s": 10.0, "started_per_s": 9.0, "steady_per_s": 9.9,
            "busy_pct": 30.0, "submit_started": s(0.45, 0.9), "submit_released": s(0.5, 1.0),
            "sbatch_wall": s(0.01, 0.02), "ctld_alloc": s(0.3, 0.6)}}}
    return out


def result(runs: list[dict], slurm: bool) -> dict:
    doc = {"command": "gpupool bench run --runs 2", "machine": "test CPU, 2 logical CPUs", "cgroups": "cgroup v1",
           "load_start": [0.5, 0.6, 0.7], "params": {"cycles": 10, "rates": [10.0], "seconds": 1.0, "runs": len(runs),
                                                     "startup": 3, "fleet": "H100-80GB*8;H100-80GB*8", "note": ""},
           "runs": runs, "slurm_note": "" if slurm else "Slurm skipped: no Slurm peer at /nowhere."}
    if slurm:
        doc["slurm_peer"] = {"version": "slurm-wlm 22.05.8", "nodes": "8", "gpus": "8", "profile": "fast",
                             "started_here": True}
    return doc


def test_report_publishes_every_run_medians_and_ratios() -> None:
    text = markdown(result([run(1.8, 0.04), run(2.0, 0.06)], slurm=True))
    assert text.startswith(BEGIN) and text.endswith(END)
    assert "`gpupool bench run --runs 2`" in text and "2 simulated nodes (16 GPUs)" in text
    assert "stopped with its `stop.sh` afterwards" in text
    assert "| `gpupool run -- true`: the CLI's wall time | 1900 ms | 2100 ms |" in text
    assert "| `gpupool run -- true`: the CLI's wall time | 1800 ms / 2000 ms | 2000 ms / 2200 ms |" in text
    assert "| **submit → GPUs free: the full cycle** | 120 ms | 240 ms |" in text
    assert "| a user's command, one job at a time: `gpupool run -- true` vs `srun true`, p50 | 1900 ms | 50 ms | " \
           "gpupool 38.0x slower |" in text
    assert "| at 10 jobs/s: submit → process started (Slurm: batch script started), p50 | 150 ms | 450 ms | " \
           "gpupool 3.0x faster |" in text
    assert "| 10/s | gpupool | 10 | 10 | 9.8 | 150 ms | 300 ms | 120 ms | 170 ms | 350 ms | 80% |" in text
    assert "| 10/s | Slurm `sbatch` | 10 | 10 | 9.9 | 450 ms | 900 ms | – | 500 ms | 1000 ms | 30% |" in text
    assert "other users' load): run 1: 3%, run 2: 3%" in text
    assert "At 10 jobs/s" not in text  # both kept up
    assert "| 10/s gpupool: jobs started | 10 of 10 | 10 of 10 |" in text
    assert "Every job of every phase started and freed its GPUs." in text


def test_report_without_slurm_says_why_and_lists_shortfalls() -> None:
    text = markdown(result([run(1.8, None, started10=7)], slurm=False))
    assert "started only" not in text
    assert "Slurm skipped: no Slurm peer at /nowhere." in text
    assert "Side by side" not in text and "| Slurm: `srun" not in text and "`srun true` (" not in text
    assert "- run 1, 10/s: of 10 offered, 10 accepted (0 errors); by 30 s after the last submission 7 had " \
           "started, 7 had freed their GPUs and 7 had completed; releases: 7 WorkCompleted (Completed)" in text


def test_a_rate_not_kept_up_with_is_said_to_be_backlog() -> None:
    slow = run(1.8, 0.04)
    slow["gpupool"]["paced"]["10"]["steady_per_s"] = 5.0
    text = markdown(result([slow], slurm=True))
    assert "At 10 jobs/s gpupool started only 5.0 jobs/s (steady): its backlog grew" in text
    assert "At 10 jobs/s Slurm" not in text
