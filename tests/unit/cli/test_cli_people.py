"""The people-facing `gpupool` commands: table formatter, YAML/flag merging, summaries, exit codes, completion."""

from __future__ import annotations

import json
import shutil
import subprocess
from datetime import UTC, datetime

import httpx
import pytest
from cli_fakes import FakeGateway, allocation, gpu, job, node, problem

from libs.cli import people
from libs.cli.main import build_parser, main
from libs.client import GpupoolClient
from libs.client.models import Allocation, Job, Node


# --- table formatter --------------------------------------------------------------------------------------------------
def test_table_aligns_columns_and_right_aligns_numbers():
    out = people.table(["NAME", "GPUS", "STATE"], [["a", 2, "running"], ["longer-name", 16, None]])
    assert out.splitlines() == [
        "NAME         GPUS  STATE",
        "a               2  running",
        "longer-name    16  -",
    ]


def test_table_cells_never_carry_control_characters_or_trailing_blanks():
    out = people.table(["A", "B"], [["x\x1b[2Jy", ""], [["m1", "m2"], True]])
    assert "\x1b" not in out and out.splitlines()[1] == "x [2Jy  -"
    assert out.splitlines()[2] == "m1,m2   yes"
    assert all(line == line.rstrip() for line in out.splitlines())


def test_table_formats_times_in_utc_and_rejects_ragged_rows():
    t = datetime(2025, 1, 1, 12, 0, 0, tzinfo=UTC)
    assert people.table(["AT"], [[t]]).splitlines()[1] == "2025-01-01 12:00:00"
    with pytest.raises(ValueError):
        people.table(["A", "B"], [["only one"]])


def test_table_with_no_rows_is_just_the_header():
    assert people.table(["A", "BB"], []) == "A  BB"


def test_age():
    now = datetime(2025, 1, 1, 12, 0, 0, tzinfo=UTC)
    assert people.fmt_age(datetime(2025, 1, 1, 11, 59, 30, tzinfo=UTC), now) == "30s"
    assert people.fmt_age(datetime(2025, 1, 1, 9, 0, 0, tzinfo=UTC), now) == "3h"
    assert people.fmt_age(None, now) == "-"


# --- YAML + flags -------------------------------------------------------------------------------------------------------
def test_flags_override_file_fields():
    doc = {"name": "ft", "team": "research", "gpus": 4, "gpu_models": ["H100-80GB"], "priority-class": "high"}
    spec = people.merge_spec(doc, {"name": None, "team": "inference", "gpus": 8, "gpu_models": None, "kind": None})
    assert spec == {"name": "ft", "team": "inference", "gpus": 8, "gpu_models": ["H100-80GB"],
                    "priority_class": "high"}


def test_model_flag_replaces_the_file_models_and_a_string_is_split():
    spec = people.merge_spec({"name": "a", "team": "t", "gpus": "2", "model": "L4, T4"}, {})
    assert spec["gpu_models"] == ["L4", "T4"] and spec["gpus"] == 2
    spec = people.merge_spec({"name": "a", "team": "t", "gpus": 1, "models": ["L4"]}, {"gpu_models": ["H100-80GB"]})
    assert spec["gpu_models"] == ["H100-80GB"]


@pytest.mark.parametrize("doc, message", [
    ({"name": "a", "team": "t", "gpus": 1, "gpu": 2}, "unknown job field 'gpu'"),
    ({"name": "a", "team": "t", "gpus": "two"}, "gpus must be a whole number"),
    ({"name": "a", "team": "t", "gpus": True}, "gpus must be a whole number"),
    ({"name": "a", "team": "t", "gpus": 1, "gpu_models": [1, 2]}, "gpu_models must be"),
    ({"team": "t"}, "missing --name, --gpus"),
])
def test_bad_specs_are_usage_errors(doc, message):
    with pytest.raises(people.UsageError, match=message):
        people.merge_spec(doc, {})


def test_spec_file_must_be_a_yaml_mapping(tmp_path):
    good = tmp_path / "job.yaml"
    good.write_text("name: a\nteam: t\ngpus: 1\n")
    assert people.load_spec_file(str(good)) == {"name": "a", "team": "t", "gpus": 1}
    (tmp_path / "list.yaml").write_text("- a\n- b\n")
    with pytest.raises(people.UsageError, match="mapping"):
        people.load_spec_file(str(tmp_path / "list.yaml"))
    (tmp_path / "bad.yaml").write_text("name: [unclosed\n")
    with pytest.raises(people.UsageError, match="not valid YAML"):
        people.load_spec_file(str(tmp_path / "bad.yaml"))
    with pytest.raises(people.UsageError, match="cannot read"):
        people.load_spec_file(str(tmp_path / "missing.yaml"))


# --- pool and top ---------------------------------------------------------------------------------------------------
def test_pool_summary_counts_allocated_used_idle_unhealthy_free():
    nodes = [Node.from_api(node("n0", [gpu(0, util=90.0), gpu(1, util=0.0), gpu(2, util=50.0),
                                       gpu(3, util=None, health="failed")])),
             Node.from_api(node("n1", [gpu(0, model="L4", util=0.0)], cluster="edge"))]
    allocs = [Allocation.from_api(allocation("a1", "j1", ["GPU-H100-80GB-0", "GPU-H100-80GB-1"])),
              Allocation.from_api(allocation("a0", "j0", ["GPU-H100-80GB-2"], released=True))]
    rows = {(r["cluster"], r["model"]): r for r in people.pool_summary(nodes, allocs)}
    assert rows[("sim", "H100-80GB")] == {"cluster": "sim", "model": "H100-80GB", "total": 4, "allocated": 2,
                                          "used": 2, "allocated_idle": 1, "unhealthy": 1, "free": 1}
    assert rows[("edge", "L4")]["free"] == 1
    text = people.pool_table(list(rows.values()))
    assert text.splitlines()[-1].split() == ["all", "-", "5", "2", "2", "1", "1", "2"]


def test_top_frame_shows_each_gpu_with_its_holder():
    nodes = [Node.from_api(node("n0", [gpu(1, util=97.0), gpu(0, util=None)]))]
    allocs = [Allocation.from_api(allocation("a1", "j1", ["GPU-H100-80GB-1"]))]
    rows = people.top_rows(nodes, allocs, [Job.from_api(job("j1", name="train"))])
    assert [r["index"] for r in rows] == [0, 1]
    frame = people.top_frame(rows, "http://gw", now=datetime(2025, 1, 1, 12, 0, tzinfo=UTC))
    lines = frame.splitlines()
    assert lines[0].startswith("gpupool top · http://gw · 12:00:00 UTC · 2 GPUs · 1 allocated · 1 used")
    assert lines[2].split()[:3] == ["NODE", "GPU", "MODEL"]
    assert lines[3].split() == ["sim/n0", "0", "H100-80GB", "-", "-/80.0", "-", "-", "healthy", "-"]
    assert lines[4].split() == ["sim/n0", "1", "H100-80GB", "97", "2.0/80.0", "40", "120", "healthy", "j1",
                                "(research/train)"]


# --- commands end to end through main(), against the fake gateway ------------------------------------------------------
@pytest.fixture()
def gw(monkeypatch) -> FakeGateway:
    fake = FakeGateway()
    monkeypatch.setattr(people, "make_client", lambda args: GpupoolClient(
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


def test_describe_shows_history_and_allocations(gw, capsys):
    gw.on("GET", "/v1/jobs/j1", job("j1", history=[
        {"at": "2025-01-01T12:00:00+00:00", "from": None, "to": "pending", "reason": "Submitted"},
        {"at": "2025-01-01T12:00:01+00:00", "from": "pending", "to": "running", "reason": "AllocationGranted"}]))
    gw.on("GET", "/v1/allocations", {"items": [allocation("a1", "j1", ["u0", "u1"])], "next": None})
    assert main(["describe", "j1"]) == 0
    out = capsys.readouterr().out
    assert "State:     running" in out and "AllocationGranted" in out and "sim/node-0  0,1" in out
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

    monkeypatch.setattr(people, "make_client", lambda args: GpupoolClient(
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
    assert people.CLEAR not in out and "sim/n0" in out and "1 used" in out


# --- completion -----------------------------------------------------------------------------------------------------------
def test_completion_spec_comes_from_the_parser():
    spec = people.completion_spec(build_parser())
    assert {"up", "submit", "jobs", "token", "completion"} <= set(spec[""]["words"])
    assert spec["token"]["words"] == ["create", "list", "revoke"]
    assert spec["jobs"]["choices"]["--state"] == list(people.JOB_STATES)
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


def test_existing_commands_are_still_registered():
    sub = build_parser()._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    assert {"up", "down", "status", "sim", "bench", "schemas"} <= set(sub)
