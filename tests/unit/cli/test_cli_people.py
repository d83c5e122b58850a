"""The people-facing `gpupool` commands: table formatter, YAML/flag merging, summaries, exit codes, completion."""

from __future__ import annotations

import json
import shutil
import subprocess
from datetime import UTC, datetime

import httpx
import pytest
from cli_fakes import (
    FakeGateway,
    allocation,
    approval,
    gpu,
    job,
    node,
    pool_doc,
    problem,
    quota,
    reclaim_policy,
)

from libs.cli import common, completion, pool, render
from libs.cli.main import build_parser, main
from libs.cli.quota import parse_until
from libs.cli.spec import load_spec_file, merge_spec
from libs.client import GpupoolClient
from libs.client.models import Allocation, Job, Node, Pool


# --- table formatter --------------------------------------------------------------------------------------------------
def test_table_aligns_columns_and_right_aligns_numbers():
    out = render.table(["NAME", "GPUS", "STATE"], [["a", 2, "running"], ["longer-name", 16, None]])
    assert out.splitlines() == [
        "NAME         GPUS  STATE",
        "a               2  running",
        "longer-name    16  -",
    ]


def test_table_cells_never_carry_control_characters_or_trailing_blanks():
    out = render.table(["A", "B"], [["x\x1b[2Jy", ""], [["m1", "m2"], True]])
    assert "\x1b" not in out and out.splitlines()[1] == "x [2Jy  -"
    assert out.splitlines()[2] == "m1,m2   yes"
    assert all(line == line.rstrip() for line in out.splitlines())


def test_table_formats_times_in_utc_and_rejects_ragged_rows():
    t = datetime(2025, 1, 1, 12, 0, 0, tzinfo=UTC)
    assert render.table(["AT"], [[t]]).splitlines()[1] == "2025-01-01 12:00:00"
    with pytest.raises(ValueError):
        render.table(["A", "B"], [["only one"]])


def test_table_with_no_rows_is_just_the_header():
    assert render.table(["A", "BB"], []) == "A  BB"


def test_age():
    now = datetime(2025, 1, 1, 12, 0, 0, tzinfo=UTC)
    assert render.fmt_age(datetime(2025, 1, 1, 11, 59, 30, tzinfo=UTC), now) == "30s"
    assert render.fmt_age(datetime(2025, 1, 1, 9, 0, 0, tzinfo=UTC), now) == "3h"
    assert render.fmt_age(None, now) == "-"


# --- YAML + flags -------------------------------------------------------------------------------------------------------
def test_flags_override_file_fields():
    doc = {"name": "ft", "team": "research", "gpus": 4, "gpu_models": ["H100-80GB"], "priority-class": "high"}
    spec = merge_spec(doc, {"name": None, "team": "inference", "gpus": 8, "gpu_models": None, "kind": None})
    assert spec == {"name": "ft", "team": "inference", "gpus": 8, "gpu_models": ["H100-80GB"],
                    "priority_class": "high"}


def test_model_flag_replaces_the_file_models_and_a_string_is_split():
    spec = merge_spec({"name": "a", "team": "t", "gpus": "2", "model": "L4, T4"}, {})
    assert spec["gpu_models"] == ["L4", "T4"] and spec["gpus"] == 2
    spec = merge_spec({"name": "a", "team": "t", "gpus": 1, "models": ["L4"]}, {"gpu_models": ["H100-80GB"]})
    assert spec["gpu_models"] == ["H100-80GB"]


@pytest.mark.parametrize("doc, message", [
    ({"name": "a", "team": "t", "gpus": 1, "gpu": 2}, "unknown job field 'gpu'"),
    ({"name": "a", "team": "t", "gpus": "two"}, "gpus must be a whole number"),
    ({"name": "a", "team": "t", "gpus": True}, "gpus must be a whole number"),
    ({"name": "a", "team": "t", "gpus": 1, "gpu_models": [1, 2]}, "gpu_models must be"),
    ({"team": "t"}, "missing --name, --gpus"),
])
def test_bad_specs_are_usage_errors(doc, message):
    with pytest.raises(common.UsageError, match=message):
        merge_spec(doc, {})


def test_spec_file_must_be_a_yaml_mapping(tmp_path):
    good = tmp_path / "job.yaml"
    good.write_text("name: a\nteam: t\ngpus: 1\n")
    assert load_spec_file(str(good)) == {"name": "a", "team": "t", "gpus": 1}
    (tmp_path / "list.yaml").write_text("- a\n- b\n")
    with pytest.raises(common.UsageError, match="mapping"):
        load_spec_file(str(tmp_path / "list.yaml"))
    (tmp_path / "bad.yaml").write_text("name: [unclosed\n")
    with pytest.raises(common.UsageError, match="not valid YAML"):
        load_spec_file(str(tmp_path / "bad.yaml"))
    with pytest.raises(common.UsageError, match="cannot read"):
        load_spec_file(str(tmp_path / "missing.yaml"))


# --- pool and top ---------------------------------------------------------------------------------------------------
def test_pool_rows_come_from_the_gateway_view_in_the_same_columns():
    rows = pool.pool_rows(Pool.from_api(pool_doc()))
    assert [(r["cluster"], r["model"]) for r in rows] == [("edge", "L4"), ("sim", "A100-80GB"), ("sim", "H100-80GB")]
    assert rows[2] == {"cluster": "sim", "model": "H100-80GB", "total": 8, "allocated": 4, "used": 3,
                       "allocated_idle": 1, "unhealthy": 1, "free": 3}
    lines = pool.pool_table(rows).splitlines()
    assert lines[0].split() == ["CLUSTER", "MODEL", "TOTAL", "ALLOCATED", "USED", "ALLOC-IDLE", "UNHEALTHY", "FREE"]
    assert lines[-1].split() == ["all", "-", "18", "5", "4", "1", "1", "12"]


def test_top_frame_shows_each_gpu_with_its_holder():
    nodes = [Node.from_api(node("n0", [gpu(1, util=97.0), gpu(0, util=None)]))]
    allocs = [Allocation.from_api(allocation("a1", "j1", ["GPU-H100-80GB-1"]))]
    rows = pool.top_rows(nodes, allocs, [Job.from_api(job("j1", name="train"))])
    assert [r["index"] for r in rows] == [0, 1]
    frame = pool.top_frame(rows, "http://gw", now=datetime(2025, 1, 1, 12, 0, tzinfo=UTC))
    lines = frame.splitlines()
    assert lines[0] == "gpupool top · http://gw · 12:00:00 UTC"
    assert lines[1].startswith("2 GPUs · 1 allocated · 1 used") and lines[2].startswith("sort node · showing all")
    assert lines[4].split() == ["NODE", "GPU", "MODEL", "UTIL%", "MEM", "TEMP", "HEALTH", "JOB"]
    assert lines[5].split() == ["n0", "0", "H100-80GB", "-", "-/80", "-", "healthy", "-"]
    assert lines[6].split() == ["n0", "1", "H100-80GB", "97", "2/80", "40", "healthy", "j1", "research/train"]
    wide = pool.top_frame(rows, "http://gw", width=120).splitlines()  # room for the power column
    assert wide[4].split()[-3:] == ["W", "HEALTH", "JOB"] and wide[6].split()[6] == "120"


def test_top_fits_80_columns_and_shows_the_apis_health_state():
    long_id = "01a235df-8536-7755-a122-cb67a133cc72"
    nodes = [Node.from_api(node(f"node-{i:02d}", [{**gpu(g, util=50.0 + g), "state": "probation"
                                                  if g == 3 else "healthy", "health": "degraded"}
                                                 for g in range(8)], cluster="eu-west"))
             for i in range(2)] + [Node.from_api(node("other", [gpu(0, util=1.0, model="L4")], cluster="local"))]
    allocs = [Allocation.from_api(allocation("a1", long_id, [f"GPU-H100-80GB-{g}" for g in range(8)]))]
    rows = pool.top_rows(nodes, allocs, [Job.from_api(job(long_id, name="llama-finetune-with-a-long-name"))])
    frame = pool.top_frame(rows, "https://gpupool.example.internal:8443")
    assert max(len(line) for line in frame.splitlines()) <= 80
    assert "probation" in frame and "degraded" not in frame  # the health state the API shows, not telemetry's
    assert long_id[:8] in frame and long_id not in frame  # a short job id
    assert "eu-west/node-00 " in frame  # several clusters: the node says which
    assert f"{long_id[:8]} research" in pool.top_frame(rows, "gw", width=100)  # the team where there is room


def test_top_sorts_and_filters_with_keys():
    nodes = [Node.from_api(node("n0", [gpu(0, util=10.0), gpu(1, util=90.0), {**gpu(2, util=0.0),
                                                                               "state": "quarantined"}]))]
    allocs = [Allocation.from_api(allocation("a1", "j1", ["GPU-H100-80GB-0"]))]
    rows = pool.top_rows(nodes, allocs, [Job.from_api(job("j1", name="train"))])
    view = pool.TopView()
    assert [r["index"] for r in pool.top_select(rows, view)] == [0, 1, 2]
    view = pool.top_key(view, "s")  # node -> util
    assert view.sort == "util" and [r["index"] for r in pool.top_select(rows, view)] == [2, 0, 1]
    view = pool.top_key(view, "r")
    assert [r["index"] for r in pool.top_select(rows, view)] == [1, 0, 2]
    view = pool.top_key(view, "u")
    assert [r["index"] for r in pool.top_select(rows, view)] == [2]
    assert pool.top_key(view, "u").only == "all"  # the same key again: everything
    view = pool.top_key(pool.top_key(view, "a"), "x")  # an unknown key changes nothing
    assert [r["index"] for r in pool.top_select(rows, view)] == [0]
    assert pool.top_select(rows, pool.TopView(match="TRAIN")) == [rows[0]]
    assert pool.top_key(view, "c") == pool.TopView(sort="util", reverse=True)
    assert pool.top_key(view, "q") is None
    assert "sort util (reversed) · showing allocated" in pool.top_frame(rows, "gw", view=view)


# --- commands end to end through main(), against the fake gateway ------------------------------------------------------
@pytest.fixture()
def gw(monkeypatch) -> FakeGateway:
    fake = FakeGateway()
    monkeypatch.setattr(common, "make_client", lambda args: GpupoolClient(
        args.url or "http://gw.test", args.token or "tok", transport=fake.transport, sleep=lambda _s: None))
    return fake


def test_jobs_table_and_json(gw, capsys):
    gw.on("GET", "/v1/jobs", {"items": [job("j1"), job("j2", state="pending", node=None)], "next": None})
    assert main(["jobs", "--team", "research"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split()[:3] == ["JOB", "ID", "NAME"] and out[1].startswith("j1 ") and "sim/node-0" in out[1]
    assert main(["jobs", "-o", "json"]) == 0
    assert [j["job_id"] for j in json.loads(capsys.readouterr().out)] == ["j1", "j2"]
    assert gw.calls[0].url.params["team"] == "research"


def test_submit_from_file_with_flag_override(gw, capsys, tmp_path):
    (tmp_path / "job.yaml").write_text("name: ft\nteam: research\ngpus: 2\ngpu_models: [H100-80GB]\nkind: training\n")
    gw.on("POST", "/v1/jobs", lambda req: httpx.Response(201, json=job("j7", **json.loads(req.content))))
    assert main(["submit", "-f", str(tmp_path / "job.yaml"), "--gpus", "4", "--priority-class", "high"]) == 0
    sent = json.loads(gw.calls[0].content)
    assert sent == {"name": "ft", "team": "research", "gpus": 4, "gpu_models": ["H100-80GB"], "kind": "training",
                    "priority_class": "high"}
    assert capsys.readouterr().out.startswith("submitted job j7")
    assert main(["submit", "-q", "-f", str(tmp_path / "job.yaml")]) == 0
    assert capsys.readouterr().out == "j7\n"  # only the id: J=$(gpupool submit -q ...) works


def test_describe_shows_history_and_allocations(gw, capsys):
    gw.on("GET", "/v1/jobs/j1", job("j1", history=[
        {"at": "2025-01-01T12:00:00+00:00", "from": None, "to": "pending", "reason": "Submitted"},
        {"at": "2025-01-01T12:00:01+00:00", "from": "pending", "to": "running", "reason": "AllocationGranted"}]))
    gw.on("GET", "/v1/allocations", {"items": [allocation("a1", "j1", ["u0", "u1"])], "next": None})
    assert main(["describe", "j1"]) == 0
    out = capsys.readouterr().out
    assert "State:       running" in out and "AllocationGranted" in out and "sim/node-0  0,1" in out
    assert gw.calls[1].url.params["job_id"] == "j1"
    assert main(["describe", "j1", "-o", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["allocations"][0]["allocation_id"] == "a1" and len(doc["history"]) == 2


def test_api_error_is_one_line_on_stderr_and_exit_1(gw, capsys):
    gw.on("POST", "/v1/jobs", problem(422, "UnknownTeam", "team 'x' does not exist"))
    assert main(["submit", "--name", "a", "--team", "x", "--gpus", "1"]) == 1
    captured = capsys.readouterr()
    assert captured.err == "error: UnknownTeam: team 'x' does not exist (HTTP 422)\n" and captured.out == ""


def test_usage_error_exit_2_without_calling_the_gateway(gw, capsys):
    assert main(["submit", "--team", "research"]) == 2
    assert capsys.readouterr().err == "error: missing --name, --gpus (as flags or in the -f file)\n"
    assert gw.calls == []
    with pytest.raises(SystemExit) as info:  # argparse's own usage errors exit 2 as well
        main(["jobs", "--state", "bogus"])
    assert info.value.code == 2


def test_unreachable_gateway_exit_3(monkeypatch, capsys):
    def down(req):
        raise httpx.ConnectError("refused", request=req)

    monkeypatch.setattr(common, "make_client", lambda args: GpupoolClient(
        "http://gw.test", "tok", transport=httpx.MockTransport(down), sleep=lambda _s: None))
    assert main(["nodes"]) == 3
    assert capsys.readouterr().err == "error: Unreachable: cannot reach gateway at http://gw.test (ConnectError)\n"


def test_no_configuration_is_exit_2(monkeypatch, tmp_path, capsys):
    monkeypatch.chdir(tmp_path)
    for name in ("GPUPOOL_URL", "GPUPOOL_TOKEN", "GPUPOOL_DATA_DIR"):
        monkeypatch.delenv(name, raising=False)
    assert main(["teams"]) == 2
    assert capsys.readouterr().err.startswith("error: no gateway URL: pass --url")


def test_unexpected_response_is_still_one_line(gw, capsys):
    gw.on("GET", "/v1/teams", {"items": [{"no_team_field": 1}], "next": None})
    assert main(["teams"]) == 1
    err = capsys.readouterr().err
    assert err == "error: InvalidResponse: cannot read the gateway's answer from /v1/teams: team: Field required\n"


def test_cancel_sends_the_reason(gw, capsys):
    gw.on("POST", "/v1/jobs/j1/cancel", job("j1", state="cancelled"))
    assert main(["cancel", "j1", "--reason", "wrong data"]) == 0
    assert json.loads(gw.calls[0].content) == {"reason": "wrong data"}
    assert capsys.readouterr().out == "job j1 is cancelled\n"


def test_token_create_shows_the_secret_once_and_never_expires_sends_null(gw, capsys):
    gw.on("POST", "/v1/tokens", lambda req: httpx.Response(201, json={
        "token_id": "t1", "name": "ci", "role": "service", "team": None, "expires_at": None, "token": "gpt_t1.s"}))
    assert main(["token", "create", "--name", "ci", "--role", "service", "--never-expires"]) == 0
    assert json.loads(gw.calls[0].content) == {"name": "ci", "role": "service", "expires_in_days": None}
    assert "gpt_t1.s" in capsys.readouterr().out
    assert main(["token", "create", "--name", "ci", "--role", "service"]) == 0
    assert json.loads(gw.calls[1].content) == {"name": "ci", "role": "service"}  # the gateway's default expiry


def test_top_once_prints_one_frame_without_clearing(gw, capsys):
    gw.on("GET", "/v1/nodes", {"items": [node("n0", [gpu(0, util=80.0)])], "next": None})
    gw.on("GET", "/v1/allocations", {"items": [], "next": None})
    gw.on("GET", "/v1/jobs", {"items": [], "next": None})
    assert main(["top", "--once"]) == 0
    out = capsys.readouterr().out
    assert pool.CLEAR not in out and "n0" in out and "1 used" in out
    assert main(["top", "--once", "--only", "unhealthy"]) == 0
    assert "No GPUs." in capsys.readouterr().out
    assert main(["top", "--once", "-o", "json", "--sort", "util"]) == 0
    assert [r["index"] for r in json.loads(capsys.readouterr().out)] == [0]


# --- completion -----------------------------------------------------------------------------------------------------------
def test_completion_spec_comes_from_the_parser():
    spec = completion.completion_spec(build_parser())
    assert {"up", "submit", "jobs", "token", "completion"} <= set(spec[""]["words"])
    assert spec["token"]["words"] == ["create", "list", "revoke"]
    assert spec["jobs"]["choices"]["--state"] == list(common.JOB_STATES)
    assert "--file" in spec["submit"]["files"] and "--data-dir" in spec["up"]["files"]
    assert "--once" in spec["top"]["options"] and "--once" not in spec["top"]["takes_value"]


@pytest.mark.skipif(shutil.which("bash") is None, reason="no bash")
@pytest.mark.parametrize("words, expected", [
    (["gpupool", "jo"], "jobs"),
    (["gpupool", "jobs", "--state", "ru"], "running"),
    (["gpupool", "jobs", "--team", "token", "-o", ""], "table json"),
    (["gpupool", "token", ""], "create list revoke"),
    (["gpupool", "token", "create", "--ro"], "--role"),
    (["gpupool", "completion", ""], "bash zsh"),
    (["gpupool", "approvals", ""], "list approve deny rule"),
    (["gpupool", "approvals", "rule", "gpus"], "gpus_over"),
    (["gpupool", "jobs", "--state", "aw"], "awaiting_approval"),
    (["gpupool", "reclaim-policies", "set", "dev", "--no-e"], "--no-enforce-max-runtime"),
])
def test_bash_completion_script_completes(words, expected, tmp_path, capsys):
    assert main(["completion", "bash"]) == 0
    script = tmp_path / "gpupool.bash"
    script.write_text(capsys.readouterr().out)
    probe = (f'source {script}; COMP_WORDS=("$@"); COMP_CWORD=$(( ${{#COMP_WORDS[@]}} - 1 )); _gpupool; '
             'echo "${COMPREPLY[*]}"')
    out = subprocess.run(["bash", "-c", probe, "_", *words], capture_output=True, text=True, timeout=10)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == expected


def test_zsh_completion_script_is_generated(capsys):
    assert main(["completion", "zsh"]) == 0
    script = capsys.readouterr().out
    assert script.startswith("#compdef gpupool") and "compdef _gpupool gpupool" in script
    assert "local cmdpath" in script and "local path" not in script  # $path is zsh's PATH array
    if shutil.which("zsh"):
        assert subprocess.run(["zsh", "-n"], input=script, text=True, timeout=10).returncode == 0


@pytest.mark.skipif(shutil.which("zsh") is None, reason="no zsh (CI installs it: .ci/run)")
@pytest.mark.parametrize("words, expected", [
    (["gpupool", "jo"], {"jobs"}),
    (["gpupool", "jobs", "--state", "ru"], {"running", "pending"}),
    (["gpupool", "token", ""], {"create", "list", "revoke"}),
    (["gpupool", "token", "create", "--ro"], {"--role"}),
    (["gpupool", "approvals", "rule", ""], {"gpus_over", "runtime_over_s", "priority_class"}),
    (["gpupool", "decisions", ""], {"list", "show", "replay"}),
    (["gpupool", "submit", "-f", ""], {"__files__"}),
])
def test_zsh_completion_offers_the_right_candidates(words, expected, tmp_path, capsys):
    """zsh's completion system, stubbed at its edges: compadd prints what it is offered (zsh itself then filters
    by the typed prefix), _files marks a file completion, compdef is a no-op outside an interactive shell."""
    assert main(["completion", "zsh"]) == 0
    script = tmp_path / "_gpupool"
    script.write_text(capsys.readouterr().out)
    probe = ('compdef() { :; }; compadd() { [[ "$1" == "--" ]] && shift; print -l -- "$@"; }; '
             f'_files() {{ print -- __files__; }}; source {script}; words=("$@"); CURRENT=${{#words}}; _gpupool')
    out = subprocess.run(["zsh", "-f", "-c", probe, "_", *words], capture_output=True, text=True, timeout=10)
    assert out.returncode == 0, out.stderr
    offered = set(out.stdout.split())
    assert expected <= offered, offered


def test_existing_commands_are_still_registered():
    sub = build_parser()._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    assert {"up", "down", "status", "sim", "bench", "schemas"} <= set(sub)


# --- job shapes, durations ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("text, seconds", [("3600", 3600), ("90s", 90), ("30m", 1800), ("2h", 7200), ("1d", 86400),
                                           ("1h30m", 5400), (120, 120), ("1.5h", 5400)])
def test_parse_duration(text, seconds):
    assert common.parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "soon", "5x", "1h 30m", "m"])
def test_bad_durations_are_usage_errors(text):
    with pytest.raises(common.UsageError, match="not a duration"):
        common.parse_duration(text)


def test_fmt_duration():
    assert [render.fmt_duration(s) for s in (0, 59, 90, 3600, 5400, 86400 + 60, None)] == [
        "0s", "59s", "1m30s", "1h", "1h30m", "1d1m", None]


def test_gang_gpus_default_to_the_product_and_yaml_takes_the_new_keys():
    spec = merge_spec({"name": "pt", "team": "t", "gang-nodes": 2, "gpus_per_node": "8",
                              "max_runtime": "2h"}, {})
    assert spec == {"name": "pt", "team": "t", "gang_nodes": 2, "gpus_per_node": 8, "gpus": 16,
                    "max_runtime_s": 7200.0}
    spec = merge_spec({"name": "chat", "team": "t", "gpus": 1, "replicas": 2}, {"replicas": 3})
    assert spec["replicas"] == 3


@pytest.mark.parametrize("doc, message", [
    ({"name": "a", "team": "t", "gang_nodes": 2}, "needs --gpus-per-node"),
    ({"name": "a", "team": "t", "gpus": 4, "gpus_per_node": 2}, "--gpus-per-node needs --gang-nodes"),
    ({"name": "a", "team": "t", "gpus": 10, "gang_nodes": 2, "gpus_per_node": 8}, r"must equal gang_nodes"),
    ({"name": "a", "team": "t", "gang_nodes": 2, "gpus_per_node": 8, "replicas": 2}, "cannot also have replicas"),
    ({"name": "a", "team": "t", "gpus": 1, "replicas": "many"}, "replicas must be a whole number"),
    ({"name": "a", "team": "t", "gpus": 1, "max_runtime_s": "a while"}, "not a duration"),
    ({"name": "a", "team": "t", "gpus": 1, "max_runtime_s": 0}, "max runtime must be positive"),
])
def test_bad_shapes_are_usage_errors(doc, message):
    with pytest.raises(common.UsageError, match=message):
        merge_spec(doc, {})


def test_submit_shape_flags_reach_the_gateway(gw, capsys):
    gw.on("POST", "/v1/jobs", lambda req: httpx.Response(201, json=job("j8", **json.loads(req.content))))
    assert main(["submit", "--name", "chat", "--team", "inference", "--gpus", "1", "--replicas", "2",
                 "--max-runtime", "30m"]) == 0
    assert json.loads(gw.calls[0].content) == {"name": "chat", "team": "inference", "gpus": 1, "replicas": 2,
                                               "max_runtime_s": 1800.0}
    out = capsys.readouterr().out
    assert "2 replicas × 1 GPU(s) of H100-80GB" in out and "max runtime 30m" in out
    assert main(["submit", "--name", "pt", "--team", "research", "--gang-nodes", "2", "--gpus-per-node", "8"]) == 0
    assert json.loads(gw.calls[1].content) == {"name": "pt", "team": "research", "gpus": 16, "gang_nodes": 2,
                                               "gpus_per_node": 8}
    assert "gang of 2 nodes × 8 GPUs" in capsys.readouterr().out


def test_submit_that_needs_approval_says_how_to_approve(gw, capsys):
    gw.on("POST", "/v1/jobs", httpx.Response(201, json=job("j9", state="awaiting_approval", approval_id="ap1",
                                                           approval_reasons=["more than 4 GPUs"])))
    assert main(["submit", "--name", "big", "--team", "research", "--gpus", "6"]) == 0
    out = capsys.readouterr().out
    assert "state awaiting_approval" in out
    assert "needs approval (more than 4 GPUs): gpupool approvals approve ap1" in out


def test_jobs_accepts_the_new_states_and_shows_the_shape(gw, capsys):
    gw.on("GET", "/v1/jobs", {"items": [job("j1", state="preempting", replicas=3),
                                        job("j2", state="awaiting_approval", gang_nodes=2, gpus_per_node=8, gpus=16,
                                            node=None)], "next": None})
    for state in ("awaiting_approval", "preempting"):
        assert main(["jobs", "--state", state]) == 0
        assert gw.calls[-1].url.params["state"] == state
    out = capsys.readouterr().out.splitlines()
    assert "SHAPE" in out[0] and "3 replicas" in out[1] and "gang 2×8" in out[2]


def test_describe_shows_shape_attempts_and_max_runtime(gw, capsys):
    gw.on("GET", "/v1/jobs/j1", job("j1", replicas=2, attempts=1, max_runtime_s=3600))
    gw.on("GET", "/v1/allocations", {"items": [], "next": None})
    assert main(["describe", "j1"]) == 0
    out = capsys.readouterr().out
    assert "Shape:       2 replicas × 2 GPU(s)" in out and "Attempts:    1" in out and "Max runtime: 1h" in out
    gw.on("GET", "/v1/jobs/j2", job("j2", gpus=1, gpu_fraction_milli=250, gpu_memory_mib=10240))
    assert main(["describe", "j2"]) == 0
    assert "Shape:       0.25 GPU + 10 GiB" in capsys.readouterr().out  # not "+ 10.0" without a unit
    gw.on("GET", "/v1/jobs/j3", job("j3", gpus=1, gpu_fraction_milli=500))  # no memory asked for
    assert main(["describe", "j3"]) == 0
    assert "Shape:       0.5 GPU\n" in capsys.readouterr().out


def test_explain_prints_the_facts_of_a_pending_reason(gw, capsys):
    facts = {"cause": "no_room", "nodes_evaluated": 12, "filtered": {"cordoned": 2, "gpu_model": 4},
             "short": {"gpus": 6}, "exhausted": "gpus",
             "quota": {"path": "default/a", "gpu_model": "*", "rule": "borrowing_limit", "used_gpus": 1,
                       "asked_gpus": 3, "limit_gpus": 3, "guaranteed_gpus": 2},
             "domain_kind": "rack", "domain": "r1", "domain_nodes": 1, "nodes_needed": 3,
             "victims_considered": 2, "reservation_nodes": ["n1", "n2"], "reservation_start": "2026-12-01T07:36:40Z",
             "reservation_in_s": 600}
    gw.on("GET", "/v1/jobs/j1/explain", {"job_id": "j1", "state": "pending", "placement": {
        "state": "pending", "reason": "NoFeasibleNode", "message": "no schedulable node has room", "facts": facts}})
    assert main(["explain", "j1"]) == 0
    out = capsys.readouterr().out
    assert "12 evaluated; filtered out: 2 cordoned, 4 gpu model; no room: 6 gpus; exhausted: gpus" in out
    assert "default/a (any model, borrowing limit): used 1 + asked 3, limit 3 (guaranteed 2)" in out
    assert "rack r1: 1 node(s) able, 3 needed" in out and "2 candidate(s) considered" in out
    assert "n1, n2 from 2026-12-01T07:36:40Z (in 600 s)" in out
    assert main(["explain", "j1", "-o", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["placement"]["facts"] == facts


def test_explain_pending_and_preempted(gw, capsys):
    gw.on("GET", "/v1/jobs/j1/explain", {"job_id": "j1", "state": "pending", "message": "waiting for placement",
                                         "placement": {"state": "pending", "reason": "NoCapacity",
                                                       "message": "no node has 8 free GPUs", "position": 3,
                                                       "priority": 100, "priority_class": "normal",
                                                       "replicas_wanted": 1, "replicas_running": 0,
                                                       "allocations": [], "preempting_for_it": ["j0"]}})
    assert main(["explain", "j1"]) == 0
    out = [" ".join(line.split()) for line in capsys.readouterr().out.splitlines()]
    assert out[:6] == ["Job: j1", "State: pending", "Message: waiting for placement", "Placement: pending",
                       "Reason: NoCapacity", "Detail: no node has 8 free GPUs"]
    assert out[6:] == ["Position: 3 (1 = next among pending jobs)", "Priority: normal (100)",
                       "Replicas: 0 running of 1 wanted", "Preempting: j0 (to make room for this job)"]
    gw.on("GET", "/v1/jobs/j2/explain", {"job_id": "j2", "state": "preempting", "message": None, "placement": {
        "state": "allocated", "reason": "PreemptedByPriority", "message": "being preempted for job j1",
        "preemptor_job_id": "j1", "deadline": "2025-01-01T12:00:30+00:00", "replicas_wanted": 1,
        "replicas_running": 1, "allocations": ["a1"]}})
    assert main(["explain", "j2"]) == 0
    out = [" ".join(line.split()) for line in capsys.readouterr().out.splitlines()]
    assert "Preempted for: j1" in out and "GPUs back at: 2025-01-01 12:00:30" in out and "Allocations: a1" in out
    assert main(["explain", "j2", "-o", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["placement"]["preemptor_job_id"] == "j1"


def test_scale(gw, capsys):
    gw.on("PATCH", "/v1/jobs/j1", lambda req: job("j1", gpus=1, **json.loads(req.content)))
    assert main(["scale", "j1", "--replicas", "3"]) == 0
    assert json.loads(gw.calls[0].content) == {"replicas": 3}
    assert capsys.readouterr().out.startswith("job j1 scaled to 3 replica(s) of 1 GPU(s) (state running)")
    assert main(["scale", "j1", "--replicas", "0"]) == 2 and len(gw.calls) == 1
    assert capsys.readouterr().err == "error: --replicas must be at least 1\n"
    gw.on("PATCH", "/v1/jobs/g1", problem(409, "NotScalable", "a gang job runs all or nothing; it cannot be scaled"))
    assert main(["scale", "g1", "--replicas", "2"]) == 1
    assert capsys.readouterr().err == ("error: NotScalable: a gang job runs all or nothing; it cannot be scaled "
                                       "(HTTP 409)\n")
    with pytest.raises(SystemExit) as info:
        main(["scale", "j1"])
    assert info.value.code == 2


def test_pool_uses_the_gateway_pool(gw, capsys):
    gw.on("GET", "/v1/pool", pool_doc())
    assert main(["pool", "--cluster", "sim"]) == 0
    assert [c.url.path for c in gw.calls] == ["/v1/pool"] and gw.calls[0].url.params["cluster"] == "sim"
    assert capsys.readouterr().out.splitlines()[-1].split() == ["all", "-", "18", "5", "4", "1", "1", "12"]
    assert main(["pool", "-o", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["all"]["totals"]["total"] == 18


# --- teams, quotas, priority classes -------------------------------------------------------------------------------------
def test_teams_lists_with_or_without_list_and_creates(gw, capsys):
    gw.on("GET", "/v1/teams", {"items": [{"team": "research", "org": "default", "quotas": [
        {"path": "default/research", "gpu_model": "H100-80GB", "guaranteed": 8.0, "borrowing_limit": None}]}],
        "next": None})
    gw.on("POST", "/v1/teams", lambda req: httpx.Response(201, json={"org": "default", **json.loads(req.content)}))
    assert main(["teams"]) == 0 and main(["teams", "list"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[1].split() == ["research", "default", "H100-80GB", "8/unlimited"] and out[3] == out[1]
    assert main(["teams", "create", "vision", "--org", "research"]) == 0
    assert json.loads(gw.calls[-1].content) == {"team": "vision", "org": "research"}
    assert capsys.readouterr().out.startswith("team vision (org research)")


def test_quota_list_set_merges_with_the_current_entry_and_delete(gw, capsys):
    entries = {("default/research", "H100-80GB"): quota()}
    gw.on("GET", "/v1/quotas", lambda req: {"items": list(entries.values()), "next": None})
    gw.on("PUT", "/v1/quotas", lambda req: quota(**json.loads(req.content)))
    gw.on("DELETE", "/v1/quotas", httpx.Response(204))
    assert main(["quota", "list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].split()[:6] == ["default/research", "H100-80GB", "8", "4", "all", "unused"]
    assert main(["quota", "set", "default/research", "--model", "H100-80GB", "--guaranteed", "16"]) == 0
    assert json.loads(gw.calls[-1].content) == {"path": "default/research", "gpu_model": "H100-80GB",
                                                "guaranteed": 16.0, "borrowing_limit": 4.0, "lending_limit": None,
                                                "weight": 1.0}  # borrowing limit kept from the current entry
    assert capsys.readouterr().out == ("quota default/research H100-80GB: guaranteed 16 · borrowing limit 4 · "
                                       "lending limit all unused · weight 1\n")
    assert main(["quota", "set", "default/vision", "--borrowing-limit", "unlimited", "--lending-limit", "2"]) == 0
    assert json.loads(gw.calls[-1].content) == {"path": "default/vision", "gpu_model": "*", "guaranteed": 0.0,
                                                "borrowing_limit": None, "lending_limit": 2.0, "weight": 1.0}
    assert main(["quota", "delete", "default/vision"]) == 0
    assert dict(gw.calls[-1].url.params) == {"path": "default/vision", "gpu_model": "*"}
    assert capsys.readouterr().out.endswith("quota default/vision * deleted\n")
    with pytest.raises(SystemExit):
        main(["quota", "set", "default/x", "--borrowing-limit", "lots"])
    assert "not a number of GPUs" in capsys.readouterr().err


def test_priority_classes_list_and_set(gw, capsys):
    gw.on("GET", "/v1/priority-classes", {"items": [{"name": "high", "value": 1000, "preemptible": False,
                                                     "min_runtime_s": None, "description": "urgent"}], "next": None})
    gw.on("PUT", "/v1/priority-classes/high", lambda req: {"name": "high", **json.loads(req.content)})
    gw.on("PUT", "/v1/priority-classes/nightly", lambda req: {"name": "nightly", **json.loads(req.content)})
    assert main(["priority-classes", "list"]) == 0
    assert capsys.readouterr().out.splitlines()[1].split() == ["high", "1000", "no", "-", "urgent"]
    assert main(["priority-classes", "set", "high", "--min-runtime", "5m"]) == 0
    assert json.loads(gw.calls[-1].content) == {"value": 1000, "preemptible": False, "min_runtime_s": 300.0,
                                                "description": "urgent"}
    assert capsys.readouterr().out == "priority class high: value 1000 · not preemptible · min runtime 5m · urgent\n"
    calls = len(gw.calls)
    assert main(["priority-classes", "set", "nightly", "--value", "50"]) == 2
    assert "is new: give --value and --preemptible or --no-preemptible" in capsys.readouterr().err
    assert len(gw.calls) == calls + 1  # only the lookup
    assert main(["priority-classes", "set", "nightly", "--value", "50", "--preemptible"]) == 0
    assert json.loads(gw.calls[-1].content) == {"value": 50, "preemptible": True, "min_runtime_s": None,
                                                "description": ""}


# --- approvals and reclaim policies ------------------------------------------------------------------------------------------
def test_approvals_list_shows_requests_and_rules(gw, capsys):
    gw.on("GET", "/v1/approvals", {"items": [approval()], "next": None, "rules": [
        {"rule": "gpus_over", "value": "4", "enabled": True},
        {"rule": "runtime_over_s", "value": "28800", "enabled": False}]})
    assert main(["approvals", "list", "--state", "pending"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split()[:3] == ["APPROVAL", "ID", "JOB"] and out[1].startswith("ap1 ")
    assert "more than 4 GPUs" in out[1]
    assert out[-1] == "rules: gpus_over 4 (enabled); runtime_over_s 8h (disabled)"
    assert gw.calls[0].url.params["state"] == "pending"
    assert main(["approvals", "list", "-o", "json"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["approval_id"] == "ap1"
    with pytest.raises(SystemExit):
        main(["approvals", "list", "--state", "maybe"])


def test_a_quota_loan_request_is_listed_and_decided_as_a_loan(gw, capsys):
    loan = approval("ap9", kind="loan", job_id=None, job_name=None, gpus=2, priority_class="",
                    reasons=["deadline"], loan_path="default/research", loan_gpu_model=None,
                    loan_until="2026-12-03T12:00:00+00:00")
    gw.on("GET", "/v1/approvals", {"items": [approval(), loan], "next": None, "rules": []})
    assert main(["approvals", "list", "--kind", "loan"]) == 0
    assert gw.calls[0].url.params["kind"] == "loan"
    rows = capsys.readouterr().out.splitlines()
    assert rows[2].startswith("ap9 ") and rows[2].split()[1] == "loan"
    assert "loan to default/research (any model) until 2026-12-03 12:00:00 UTC" in rows[2]
    gw.on("POST", "/v1/approvals/ap9/approve", {**loan, "state": "approved"})
    assert main(["approvals", "approve", "ap9"]) == 0
    assert capsys.readouterr().out == ("approval ap9 approved: 2 GPU(s) loan to default/research (any model) until "
                                       "2026-12-03 12:00:00 UTC: the guarantee is lent\n")


def test_approve_and_deny_with_comment(gw, capsys):
    gw.on("POST", "/v1/approvals/ap1/approve", lambda req: approval(state="approved", **json.loads(req.content)))
    gw.on("POST", "/v1/approvals/ap2/deny", lambda req: approval("ap2", state="denied", **json.loads(req.content)))
    assert main(["approvals", "approve", "ap1", "--comment", "ok for this sprint"]) == 0
    assert json.loads(gw.calls[-1].content) == {"comment": "ok for this sprint"}
    assert capsys.readouterr().out == "approval ap1 approved: job j1 (research/big) joins the queue\n"
    assert main(["approvals", "deny", "ap2"]) == 0
    assert json.loads(gw.calls[-1].content) == {"comment": ""}
    assert capsys.readouterr().out == "approval ap2 denied: job j1 (research/big) fails with ApprovalDenied\n"
    gw.on("POST", "/v1/approvals/nope/approve", problem(404, "ApprovalNotFound", "no approval request nope"))
    assert main(["approvals", "approve", "nope"]) == 1
    assert capsys.readouterr().err == "error: ApprovalNotFound: no approval request nope (HTTP 404)\n"


def test_approval_rules(gw, capsys):
    gw.on("GET", "/v1/approvals", {"items": [], "next": None, "rules": [
        {"rule": "gpus_over", "value": "4", "enabled": True}]})
    gw.on("PUT", "/v1/approval-rules/gpus_over", lambda req: {"rule": "gpus_over", **json.loads(req.content)})
    gw.on("PUT", "/v1/approval-rules/runtime_over_s", lambda req: {"rule": "runtime_over_s",
                                                                   **json.loads(req.content)})
    assert main(["approvals", "rule", "gpus_over", "8"]) == 0
    assert json.loads(gw.calls[-1].content) == {"value": "8", "enabled": True}
    assert capsys.readouterr().out == "rule gpus_over 8 (enabled)\n"
    assert main(["approvals", "rule", "gpus_over", "--disable"]) == 0  # keeps the current value
    assert json.loads(gw.calls[-1].content) == {"value": "4", "enabled": False}
    assert capsys.readouterr().out == "rule gpus_over 4 (disabled)\n"
    assert main(["approvals", "rule", "runtime_over_s", "8h"]) == 0
    assert json.loads(gw.calls[-1].content) == {"value": "28800", "enabled": True}
    assert main(["approvals", "rule", "runtime_over_s", "--disable"]) == 2
    assert "never set" in capsys.readouterr().err
    assert main(["approvals", "rule", "gpus_over"]) == 2
    with pytest.raises(SystemExit):
        main(["approvals", "rule", "too_big", "1"])


def test_reclaim_policies_list_and_set_merge(gw, capsys):
    gw.on("GET", "/v1/reclaim-policies", {"items": [reclaim_policy("training", idle_after_s=None),
                                                    reclaim_policy("dev")], "next": None})
    gw.on("PUT", "/v1/reclaim-policies/dev", lambda req: reclaim_policy("dev", **json.loads(req.content)))
    assert main(["reclaim-policies", "list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].split()[:5] == ["dev", "30m", "5", "5m", "yes"]
    assert lines[2].split()[:5] == ["training", "never", "5", "5m", "yes"]
    assert main(["reclaim-policies", "set", "dev", "--grace", "1m", "--no-enforce-max-runtime"]) == 0
    assert json.loads(gw.calls[-1].content) == {"idle_after_s": 1800.0, "idle_util_pct": 5.0, "grace_s": 60.0,
                                                "enforce_max_runtime": False}
    assert capsys.readouterr().out == ("reclaim policy dev: idle below 5% for 30m → warned, reclaimed after 1m grace"
                                       " · max runtime not enforced\n")
    assert main(["reclaim-policies", "set", "dev", "--idle-after", "never"]) == 0
    assert json.loads(gw.calls[-1].content)["idle_after_s"] is None
    assert main(["reclaim-policies", "set", "dev", "--idle-util-pct", "150"]) == 2
    with pytest.raises(SystemExit):
        main(["reclaim-policies", "set", "gpu-hog"])


def test_completion_picks_up_the_new_commands():
    spec = completion.completion_spec(build_parser())
    assert {"explain", "scale", "quota", "priority-classes", "approvals", "reclaim-policies"} <= set(spec[""]["words"])
    assert spec["teams"]["words"] == ["list", "create"]
    assert spec["quota"]["words"] == ["list", "set", "delete", "loan", "loans"]
    assert spec["approvals"]["words"] == ["list", "approve", "deny", "rule"]
    assert spec["approvals rule"]["words"] == list(common.APPROVAL_RULES)
    assert spec["reclaim-policies set"]["words"] == list(common.JOB_KINDS)
    assert "--replicas" in spec["scale"]["takes_value"]
    assert {"--gang-nodes", "--gpus-per-node", "--replicas", "--max-runtime"} <= set(spec["submit"]["takes_value"])
    assert {"--preemptible", "--no-preemptible"} <= set(spec["priority-classes set"]["options"])
    assert "awaiting_approval" in spec["jobs"]["choices"]["--state"]


def test_loan_end_dates_are_dates_or_durations():
    from datetime import UTC, datetime

    now = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
    assert parse_until("7d", now) == datetime(2026, 12, 7, 12, 0, tzinfo=UTC)
    assert parse_until("2026-12-24", now) == datetime(2026, 12, 24, tzinfo=UTC)
    assert parse_until("2026-12-24T18:00Z", now) == datetime(2026, 12, 24, 18, 0, tzinfo=UTC)
    with pytest.raises(common.UsageError, match="--until"):
        parse_until("next week", now)
