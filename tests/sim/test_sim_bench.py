"""`gpupool bench` writes the report (a quick run on small sizes, without the trace sections)."""

from __future__ import annotations

from libs.bench import core as bench
from libs.core.schedule import PHASES


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


def test_the_fill_section_publishes_every_seed_and_fgds_own_numbers_beside_ours(tmp_path):
    ref = tmp_path / "ref.csv"
    ref.write_text("workload,sc_policy,tune,seed,total_gpus,allocated_pct_at_100,unallocated_pct_at_100\n"
                   + "".join(f"openb_pod_list_default,06-FGD,1.3,{s},6212,95.2,{4.8 - 0.01 * (s - 42):.2f}\n"
                             for s in range(42, 45))
                   + "openb_pod_list_default,05-BestFit,1.3,42,6212,92.9,7.10\n")
    reference = bench.fgd_reference(ref)
    assert reference["FGD"] == {42: 0.048, 43: 0.0479, 44: 0.0478} and reference["BestFit"] == {42: 0.071}
    ours = {"default": {42: 0.05, 43: 0.06, 44: 0.055}, "fgd-best-fit": {42: 0.07, 43: 0.072, 44: 0.071}}
    text = "\n".join(bench.fill_section(ours, 6212, 1213, reference, "gpupool sim fill --runs 3"))
    rows = {r[0]: r for r in _table(text, "## Fill experiment")[1:]}
    assert rows["default (gpupool)"][1] == "5.50%" and rows["default (gpupool)"][3] == "5.00–6.00%"
    assert rows["default (gpupool)"][4] == "5.00, 6.00, 5.50"  # every seed, in seed order
    assert "`gpupool sim fill --runs 3`" in text
    theirs = {r[0]: r for r in _table(text, "FGD's own results")[1:]}
    assert theirs["FGD"][1] == "4.79%" and list(theirs) == ["BestFit", "FGD"]  # worst first
    assert "0.71 points above FGD's (5.50% vs 4.79%)" in text
    assert bench.fgd_reference(tmp_path / "missing.csv") == {}
