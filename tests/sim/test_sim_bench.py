"""`gpupool bench` writes the report (a quick run on small sizes, without the trace sections)."""

from __future__ import annotations

from libs.core.schedule import PHASES
from libs.sim import bench


def _table(text: str, heading: str) -> list[list[str]]:
    """The rows of the first table after `heading`, as cells."""
    part = text[text.index(heading):]
    rows = []
    for line in part.splitlines()[1:]:
        if line.startswith("| ") and not line.startswith("| ---"):
            rows.append([c.strip() for c in line.strip("|").split("|")])
        elif rows and not line.startswith("|"):
            break
    return rows


def test_quick_bench_writes_machine_command_rates_phases_and_incremental_cost(tmp_path):
    out = tmp_path / "benchmarks.md"
    owned = ("<!-- platform-benchmark:begin -->\nkept as is\n<!-- platform-benchmark:end -->\n\n"
             "<!-- dashboard-benchmark:begin -->\n| also | kept |\n<!-- dashboard-benchmark:end -->\n")
    out.write_text("old\n\n" + owned)
    assert bench.main(["--quick", "--skip-traces", "--repeats", "1", "--out", str(out)]) == 0
    text = out.read_text()
    assert "Machine:" in text and "gpupool bench --quick" in text
    rates = {r[0]: r for r in _table(text, "## Placement decisions per second")[1:]}
    assert set(rates) == {"default", "best-fit", "fifo"} and float(rates["default"][2].replace(",", "")) > 0
    phases = _table(text, "### Where a cycle's time goes")
    assert phases[0][1:1 + len(PHASES)] == list(PHASES)
    assert {r[0] for r in phases[1:]} == {"default", "best-fit", "fifo"}
    assert all(float(r[-1].replace(",", "")) > 0 for r in phases[1:])
    assert _table(text, "## Cycle time at")[1][0] == "default"
    incremental = _table(text, "## Incremental indexes vs a full rebuild")[1:]
    assert {(r[0], r[2]) for r in incremental} == {(p, q) for p in ("default", "best-fit")
                                                   for q in ("arrivals", "backlog")}
    assert text.endswith(owned) and text.startswith("# Benchmarks")  # sections other commands own survive, byte for byte
