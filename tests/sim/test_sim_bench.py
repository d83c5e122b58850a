"""`gpupool bench` writes the report (a quick run on small sizes, without the trace sections)."""

from __future__ import annotations

from libs.sim import bench


def test_quick_bench_writes_machine_command_and_decision_rates(tmp_path):
    out = tmp_path / "benchmarks.md"
    assert bench.main(["--quick", "--skip-traces", "--repeats", "1", "--out", str(out)]) == 0
    text = out.read_text()
    assert "Machine:" in text and "gpupool bench --quick" in text
    assert "Placement decisions per second" in text and "Cycle time at" in text
    rows = [line for line in text.splitlines() if line.startswith("| default |")]
    assert len(rows) == 2
    rate = float(rows[0].split("|")[3].replace(",", ""))
    assert rate > 0
