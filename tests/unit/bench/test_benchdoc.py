"""The one machine line every benchmark's report carries (libs/bench/benchdoc.py)."""

from __future__ import annotations

import os
import platform

import pytest

from libs.bench import backlog, benchdoc, reclaim


def test_the_machine_line_names_the_cpu_model_cpus_memory_python_and_os(tmp_path) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: Test CPU @ 3.00GHz\n")
    line = benchdoc.machine(cpuinfo)
    assert line.startswith(f"Test CPU @ 3.00GHz, {os.cpu_count()} logical CPUs, ")
    assert f"Python {platform.python_version()} ({platform.python_implementation()})" in line
    assert line.endswith(f"{platform.system()} {platform.release()}")
    memory = benchdoc.memory_gib()
    assert memory is None or f", {memory:.0f} GiB RAM, " in line


def test_without_cpuinfo_the_platform_module_names_the_processor(tmp_path) -> None:
    assert benchdoc.cpu_model(tmp_path / "absent") == (platform.processor() or platform.machine())


def test_the_reports_use_the_one_machine_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(benchdoc, "machine", lambda: "MACHINE-LINE")
    backlog_row = {"depth": 100, "turnovers": 30, "submit_per_s": 200.0, "next_start_p50_ms": 40.0,
                   "next_start_p90_ms": 80.0, "next_start_max_ms": 120.0, "turnovers_per_s": 5.0,
                   "cycles_per_turnover": 1.5, "cycle_mean_ms": 20.0,
                   "cpu_ms_per_turnover": {"placement": 10.0, "postgres": 10.0}}
    assert "Machine: MACHINE-LINE." in backlog.markdown([backlog_row], "gpupool bench backlog")
    reclaimed = {"nodes": 2, "gpus": 16, "jobs": 12, "idle_after_s": 20, "grace_s": 5, "window_s": 120,
                 "reclaimed": 4, "dev_sessions": 4, "busy_jobs_reclaimed": 0, "gpu_hours_held_idle_before_reclaim": 0.1,
                 "gpu_hours_recovered": 0.2, "recovered_share": 0.5, "gpu_hours_allocated_in_window": 0.4,
                 "waste_report_named_reclaimed": 4}
    assert "Machine: MACHINE-LINE." in reclaim.markdown(reclaimed, "gpupool bench reclaim")
