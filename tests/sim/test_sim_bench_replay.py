"""`gpupool bench replay`'s section of docs/benchmarks.md: one row per policy with churn, windowed fairness and the
replay's own time, written between its markers and nothing else touched."""

from __future__ import annotations

from sim_builders import node_list, openb_tasks

from libs.bench import replay as bench_replay
from libs.bench.benchdoc import write_section
from libs.sim import engine, traces


def test_the_section_has_a_row_per_policy_with_churn_fairness_and_cpu_against_best_fit(tmp_path):
    nodes = traces.read_nodes(node_list(tmp_path / "nodes.csv", shapes=((8, "G2", 96000, 393216, 2),)))
    jobs = traces.openb_jobs(traces.read_tasks(openb_tasks(tmp_path / "t.csv", n=60)), seed=0)
    results = bench_replay.rows(nodes, jobs, ablation=True)
    assert [name for name, _ in results] == ["default", "best-fit", "fifo", "default, reclaim hysteresis 600 s"]
    text = bench_replay.section(results, "gpupool bench replay --limit 60", 16, 2, len(jobs), 0.1)
    assert text.startswith(bench_replay.BEGIN) and text.endswith(bench_replay.END)
    rows = [line for line in text.splitlines() if line.startswith("| default") or line.startswith("| fifo")
            or line.startswith("| best-fit")]
    assert len(rows) == 4
    best_fit = next(r for r in rows if r.startswith("| best-fit"))
    assert "| 1.00x | " in best_fit
    doc = tmp_path / "benchmarks.md"
    doc.write_text("# Benchmarks\n\nkept\n")
    write_section(doc, bench_replay.BEGIN, bench_replay.END, text)
    write_section(doc, bench_replay.BEGIN, bench_replay.END, text)  # replaced, not appended twice
    out = doc.read_text()
    assert out.count(bench_replay.BEGIN) == 1 and "kept" in out


def test_the_hysteresis_row_differs_from_default_only_in_the_reclaim_minimum(tmp_path):
    assert engine.make_policy("default", ["a", "b"], 8.0).reclaim_min_runtime_s == 0.0
    assert bench_replay.HYSTERESIS == {"reclaim_min_runtime_s": engine.RECLAIM_MIN_RUNTIME_S} and \
        engine.RECLAIM_MIN_RUNTIME_S > 0


def test_rounds_replay_the_pair_again_and_take_medians(tmp_path):
    nodes = traces.read_nodes(node_list(tmp_path / "nodes.csv", shapes=((8, "G2", 96000, 393216, 2),)))
    jobs = traces.openb_jobs(traces.read_tasks(openb_tasks(tmp_path / "t.csv", n=40)), seed=0)
    results = dict(bench_replay.rows(nodes, jobs, ablation=False, repeat=3))
    assert [len(results[p]["cpu_runs"]) for p in ("default", "best-fit", "fifo")] == [3, 3, 1]
    for m in results.values():
        assert m["cpu_s"] == sorted(m["cpu_runs"])[len(m["cpu_runs"]) // 2]
    assert bench_replay.cpu_ratio({"cpu_runs": [2.0, 9.0, 3.0], "cpu_s": 3.0},
                                  {"cpu_runs": [1.0, 3.0, 1.0], "cpu_s": 1.0}) == 3.0  # rounds: 2x, 3x, 3x
    assert bench_replay.cpu_ratio({"cpu_runs": [4.0], "cpu_s": 4.0}, {"cpu_runs": [1.0, 3.0, 1.0], "cpu_s": 1.0}) == 4.0
    text = bench_replay.section(list(results.items()), "gpupool bench replay --repeat 3", 16, 2, len(jobs), 0.1)
    default_row = next(line for line in text.splitlines() if line.startswith("| default"))
    assert default_row.count(", ") == 2  # its three rounds' CPU seconds published


def test_a_repeat_below_one_is_refused(capsys):
    assert bench_replay.main(["--repeat", "0"]) == 2
    assert "--repeat must be at least 1" in capsys.readouterr().err
