"""`gpupool sim` command lines: stable options, metrics.json keys, plots, help."""

from __future__ import annotations

import json

import pytest
from sim_builders import generic_trace, node_list, openb_tasks

from libs.sim import cli

REPLAY_KEYS = ("jct_mean_s", "jct_p99_s", "queue_mean_s", "queue_p99_s", "gpu_allocation_rate", "jain_fairness",
               "preemptions")


def test_fill_writes_unallocated_share_curve_and_plot_for_any_task_file(tmp_path, capsys):
    nodes = node_list(tmp_path / "nodes.csv")
    # only the required columns: name,cpu_milli,memory_mib,num_gpu,gpu_milli
    tasks = tmp_path / "tasks.csv"
    tasks.write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli\n"
                     + "".join(f"t{i},{2000 + 1000 * (i % 5)},4096,{1 if i % 7 else 2},{(300, 1000)[i % 2]}\n"
                               for i in range(40)))
    out = tmp_path / "out"
    rc = cli.main(["fill", "--nodes", str(nodes), "--tasks", str(tasks), "--policy", "best-fit,default",
                   "--seed", "3", "--out", str(out)])
    assert rc == 0
    m = json.loads((out / "metrics.json").read_text())
    assert 0.0 <= m["unallocated_gpu_share"] <= 1.0
    assert m["curve"][0] == {"arrived": 0.0, "unallocated_gpu_share": 1.0}
    assert set(m["policies"]) == {"best-fit", "default"} and "default_vs_best_fit_reduction" in m
    assert (out / "fill_unallocated.png").stat().st_size > 0
    assert "unallocated_gpu_share" in capsys.readouterr().out


@pytest.mark.parametrize("fmt", ["openb", "generic"])
def test_replay_writes_the_documented_metrics_and_plots(tmp_path, fmt):
    nodes = node_list(tmp_path / "nodes.csv", shapes=((8, "G2", 96000, 393216, 2),))
    trace = openb_tasks(tmp_path / "t.csv", n=80) if fmt == "openb" else generic_trace(tmp_path / "g.csv", n=80)
    out = tmp_path / "out"
    rc = cli.main(["replay", "--trace", str(trace), "--format", fmt, "--nodes", str(nodes), "--policy",
                   "default,fifo", "--out", str(out)])
    assert rc == 0
    m = json.loads((out / "metrics.json").read_text())
    for key in REPLAY_KEYS:
        assert isinstance(m[key], (int, float))
        assert key in m["policies"]["fifo"]
    for png in ("allocation_rate.png", "fragmentation.png", "jct_cdf.png", "jct_queue.png", "team_share.png",
                "preemptions.png"):
        assert (out / png).stat().st_size > 0


def test_unknown_policy_is_a_usage_error(tmp_path):
    with pytest.raises(SystemExit) as e:
        cli.main(["fill", "--nodes", "n.csv", "--tasks", "t.csv", "--policy", "nope", "--out", str(tmp_path)])
    assert e.value.code == 2


def test_missing_file_reports_an_error_instead_of_a_traceback(tmp_path, capsys):
    rc = cli.main(["fill", "--nodes", str(tmp_path / "missing.csv"), "--tasks", str(tmp_path / "x.csv"),
                   "--out", str(tmp_path / "o")])
    assert rc == 2 and "error" in capsys.readouterr().err


@pytest.mark.parametrize("command,options", [
    ("fill", ["--nodes", "--tasks", "--policy", "--seed", "--runs", "--out", "--definition", "--tune",
              "--max-arrived", "--sharing"]),
    ("replay", ["--trace", "--format", "--nodes", "--policy", "--out", "--seed", "--max-nodes", "--limit",
                "--time-scale", "--cycle-interval", "--sharing"]),
])
def test_help_documents_every_option(command, options, capsys):
    with pytest.raises(SystemExit):
        cli.main([command, "--help"])
    text = capsys.readouterr().out
    assert text.startswith("usage: gpupool sim " + command)
    for opt in options:
        assert opt in text


def test_top_level_help_lists_every_option_of_every_command(capsys):
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    text = capsys.readouterr().out
    parser = cli.build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    for name, sp in sub.choices.items():
        assert f"gpupool sim {name} " in text
        for action in sp._actions:
            for opt in action.option_strings:
                if opt not in ("-h", "--help"):
                    assert f"    {opt} " in text, (name, opt)


def _fill(tmp_path, nodes_csv: str, tasks_csv: str, policy: str = "default", definition: str = "fgd") -> dict:
    (tmp_path / "n.csv").write_text(nodes_csv)
    (tmp_path / "t.csv").write_text(tasks_csv)
    out = tmp_path / f"out-{policy}-{definition}"
    assert cli.main(["fill", "--nodes", str(tmp_path / "n.csv"), "--tasks", str(tmp_path / "t.csv"), "--policy",
                     policy, "--seed", "1", "--out", str(out), "--definition", definition]) == 0
    return json.loads((out / "metrics.json").read_text())


NODES = "sn,cpu_milli,memory_mib,gpu,model\nbig,96000,393216,8,G2\nsmall,104000,524288,2,T4\n"


FILLS = [(p, "fgd") for p in ("default", "best-fit", "fifo", "fgd-best-fit")] + [
    (p, "legacy") for p in ("default", "best-fit", "fifo")]


@pytest.mark.parametrize("policy,definition", FILLS)
def test_fill_honours_gpu_spec_when_the_column_is_present(tmp_path, policy, definition):
    anywhere = _fill(tmp_path, NODES, "name,cpu_milli,memory_mib,num_gpu,gpu_milli\nt,1000,1024,1,1000\n", policy,
                     definition)
    assert anywhere["unallocated_gpu_share"] == 0.0  # 10 one-GPU tasks fill the 10 GPUs
    only_t4 = _fill(tmp_path, NODES, "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\nt,1000,1024,1,1000,T4\n",
                    policy, definition)
    assert only_t4["unallocated_gpu_share"] == pytest.approx(0.8)  # only the two T4s can be used
    # legacy: 10 arrive (to 100%), fgd: 13 (to 130%); 2 fit
    assert only_t4["tasks_failed"] == (8 if definition == "legacy" else 11)


@pytest.mark.parametrize("policy,definition", FILLS)
def test_fill_places_a_task_only_where_cpu_memory_and_gpu_all_fit(tmp_path, policy, definition):
    # 100 cores fit only the T4 node (104 cores), and only once: its second GPU stays unallocated
    cpu = _fill(tmp_path, NODES, "name,cpu_milli,memory_mib,num_gpu,gpu_milli\nt,100000,1024,1,1000\n", policy,
                definition)
    assert cpu["unallocated_gpu_share"] == pytest.approx(0.9)
    # 400 GiB of memory fit only the T4 node (512 GiB), once
    mem = _fill(tmp_path, NODES, "name,cpu_milli,memory_mib,num_gpu,gpu_milli\nt,1000,409600,1,1000\n", policy,
                definition)
    assert mem["unallocated_gpu_share"] == pytest.approx(0.9)


def test_fill_runs_seeds_and_reports_each_policys_median_and_every_seed(tmp_path):
    tasks = tmp_path / "tasks.csv"
    tasks.write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli\n"
                     + "".join(f"t{i},{2000 + 1000 * (i % 5)},4096,{1 if i % 7 else 2},{(300, 1000)[i % 2]}\n"
                               for i in range(40)) + "cpu-only,4000,8192,0,0\n")
    out = tmp_path / "out"
    assert cli.main(["fill", "--nodes", str(node_list(tmp_path / "nodes.csv")), "--tasks", str(tasks), "--policy",
                     "default,fgd-best-fit", "--seed", "42", "--runs", "3", "--out", str(out)]) == 0
    m = json.loads((out / "metrics.json").read_text())
    assert m["definition"] == "fgd" and m["policy"] == "default"
    for p in ("default", "fgd-best-fit"):
        got = m["policies"][p]
        seeds = got["seeds"]
        assert sorted(seeds) == ["42", "43", "44"] and got["runs"] == 3
        assert got["unallocated_gpu_share"] == sorted(seeds.values())[1]  # the median of three
        assert got["min"] <= got["unallocated_gpu_share"] <= got["max"] and got["samples_at_100"] > 0
    assert m["unallocated_gpu_share"] == m["policies"]["default"]["unallocated_gpu_share"]


def test_fgd_best_fit_is_a_baseline_of_the_fgd_definition_only(tmp_path, capsys):
    rc = cli.main(["fill", "--nodes", str(node_list(tmp_path / "nodes.csv")), "--tasks",
                   str(openb_tasks(tmp_path / "t.csv", n=20)), "--policy", "fgd-best-fit", "--definition", "legacy",
                   "--out", str(tmp_path / "o")])
    assert rc == 2 and "goes with --definition fgd" in capsys.readouterr().err
