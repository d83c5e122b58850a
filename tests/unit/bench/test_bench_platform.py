"""The platform benchmark's report and profiler plumbing: pure parts, no platform."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from libs.bench import e2e as bench_platform
from libs.bench.e2e import BEGIN, END, Profiler, calls_table, markdown, pct, statements_table


def result(**median_extra: float) -> dict:
    median = {
        "rates": [{"rate": 100.0, "jobs": 1000, "latency_p50_s": 0.012, "latency_p99_s": 0.08,
                   "started_per_s": 99.0}],
        "burst_started_per_s": 120.0, "burst_submitted_per_s": 200.0, "burst_all_started_s": 8.3,
        "burst_latency_p50_s": 1.0, "burst_latency_p99_s": 2.0,
        "burst_cpu_ms_per_job": {"gateway": 1.4, "queue": 2.5, "postgres": 4.0},
        "burst_rss_mib": {"gateway": 66.0, "queue": 54.0, "postgres": 1200.0},
        **median_extra,
    }
    return {"median": median, "params": {"runs": 1, "burst": 1000, "rates": [100.0], "seconds": 10.0,
                                         "clients": 8, "fleet": "8 nodes x 8 GPUs (simulated)"}}


def test_the_report_charges_the_load_generator_separately_from_the_platform() -> None:
    text = markdown(result(burst_loadgen_cpu_ms_per_job=0.47, burst_http_requests_per_job=2.0), None,
                    "gpupool bench platform", 100.0)
    assert text.startswith(BEGIN) and text.endswith(END)
    assert "| **all** | **7.9** |" in text  # gateway + queue + postgres only
    assert "load generator itself" in text and "used 0.47 ms CPU per job" in text and "2.00 HTTP requests" in text
    assert "| at 100 jobs/s: p50 < 20 ms | 12 ms at 100/s | yes |" in text


def test_results_recorded_before_the_load_generator_was_metered_still_render() -> None:
    text = markdown(result(), None, "gpupool bench platform", 100.0)
    assert "load generator itself" not in text and "| gateway | 1.40 | 66 |" in text


def test_percentiles_interpolate() -> None:
    assert pct([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    assert pct([5.0], 99) == 5.0


def test_profiling_without_py_spy_is_skipped_with_a_note(tmp_path: Path, monkeypatch, capsys) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(bench_platform.shutil, "which", lambda *a, **k: None)
    profiler = Profiler(tmp_path / "prof")
    profiler.start({"services": {"gateway": {"pid": 1}}}, "run1-burst")
    profiler.stop(jobs=0)
    assert "py-spy is not installed" in capsys.readouterr().out
    assert not (tmp_path / "prof").exists()


def test_a_profile_is_recorded_per_service_and_written_when_the_phase_ends(tmp_path: Path) -> None:
    profiler = Profiler(tmp_path, fmt="raw", rate=200, only=("gateway",))
    if profiler.exe is None:
        pytest.skip("py-spy is an optional tool (pip install py-spy); the path without it is tested above")
    target = subprocess.Popen(["python3", "-c", "while True: sum(range(1000))"])
    try:
        profiler.start({"services": {"gateway": {"pid": target.pid}, "queue": {"pid": target.pid}}}, "run1-burst")
        time.sleep(1.5)
        profiler.stop(jobs=0)
    finally:
        target.kill()
        target.wait()
    written = sorted(p.name for p in tmp_path.iterdir())
    assert written == ["run1-burst-gateway.txt"]  # only the service asked for
    assert "<module>" in (tmp_path / written[0]).read_text()


def test_postgres_statements_are_charged_per_job_most_expensive_first() -> None:
    rows = [{"db": "gpupool_queue", "calls": 3000, "total_exec_time": 300.0, "rows": 3000, "wal_bytes": 6_000_000,
             "query": "INSERT INTO outbox (a | b)\n   VALUES ($1)"},
            {"db": "gpupool_placement", "calls": 80, "total_exec_time": 100.0, "rows": 80, "wal_bytes": None,
             "query": "SELECT json_build_object()"}]
    text = statements_table(rows, jobs=1000)
    assert text.startswith("1000 jobs; execution time of the top 2 statements: 400 ms (0.400 ms per job)")
    lines = text.splitlines()
    assert lines[4] == ("| gpupool_queue | 3.00 | 0.3000 | 75.0% | 1.0 | 6000 | "
                        "`INSERT INTO outbox (a \\| b) VALUES ($1)` |")
    assert lines[5].startswith("| gpupool_placement | 0.08 | 0.1000 | 25.0% | 1.0 | 0 |")


def test_every_statement_is_counted_per_database_and_job() -> None:
    rows = [{"db": "gpupool_placement", "calls": 4000, "inbox": 200, "commits": 300},
            {"db": "gpupool_queue", "calls": 6000, "inbox": None, "commits": 1000}]
    lines = calls_table(rows, jobs=1000).splitlines()
    assert lines[3:] == ["| gpupool_placement | 4.00 | 0.20 | 0.30 |", "| gpupool_queue | 6.00 | 0.00 | 1.00 |",
                         "| all | 10.00 | 0.20 | 1.30 |"]
    assert calls_table([], jobs=1000) == ""


def test_a_limited_backlog_reports_what_was_admitted_and_refused_in_both_durabilities() -> None:
    limited = result(burst_admitted=640.0, burst_refused=360.0)
    limited["params"]["max_backlog"] = 500
    limited["unsafe"] = result(burst_admitted=700.0, burst_refused=300.0)
    text = markdown(limited, {"burst_start_p99_s": 1.9, "burst_started_per_s": 90.0}, "gpupool bench platform",
                    100.0)
    assert "limited to 500 waiting jobs" in text and "640 were admitted and 360 refused with `429 QueueFull`" in text
    assert "p99 2000 ms (of the jobs admitted)" in text
    assert "| saturation: admitted / refused with 429 | 640 / 360 | 700 / 300 |" in text
    assert "| saturation: submit → granted p99 of the jobs admitted (Slurm: → running) | 2000 ms | 1900 ms |" in text
    unlimited = markdown(result(), None, "gpupool bench platform", 100.0)
    assert "refused" not in unlimited and "of the jobs admitted" not in unlimited
