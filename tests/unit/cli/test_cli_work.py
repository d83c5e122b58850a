"""`gpupool submit -- CMD`, `gpupool run`, `gpupool logs` against the fake gateway: the bodies built from flags
and files, usage errors, the exit status rules, Ctrl-C, stdout and stderr kept apart, completion."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from cli_fakes import FakeGateway, job, problem

from libs.cli import common, completion, work
from libs.cli.main import build_parser, main
from libs.client import GpupoolClient, GpupoolError
from libs.client.models import Job

WORK_DOC = {"command": ["sh", "-c", "echo hi"], "env": {}, "limits": {}, "restart": {"policy": "never"}}


@pytest.fixture()
def gw(monkeypatch) -> FakeGateway:
    fake = FakeGateway()
    monkeypatch.setattr(common, "make_client", lambda args: GpupoolClient(
        args.url or "http://gw.test", args.token or "tok", transport=fake.transport, sleep=lambda _s: None))
    monkeypatch.setattr(work, "POLL_S", 0.0)
    return fake


def sent_bodies(gw: FakeGateway) -> list[dict[str, Any]]:
    return [json.loads(c.content) for c in gw.calls if c.method == "POST" and c.url.path == "/v1/jobs"]


def echo_submission(req: httpx.Request) -> httpx.Response:
    return httpx.Response(201, json=job("j9", **{**json.loads(req.content), "state": "pending"}))


# --- submit ---------------------------------------------------------------------------------------------------------
def test_submit_sends_the_command_after_dashes_and_every_work_flag(gw, capsys):
    gw.on("POST", "/v1/jobs", echo_submission)
    assert main(["submit", "--name", "train", "--team", "research", "--gpus", "2", "--env", "A=1", "--env", "B=x=y",
                 "--workdir", "/scratch/t", "--memory-mib", "16GiB", "--cpu-milli", "2000", "--pids", "256",
                 "--stop-signal", "SIGINT", "--stop-grace", "1m", "--max-runtime", "2h", "--warn-before", "5m",
                 "--warn-signal", "SIGUSR2", "--restart", "on_failure:3:30s", "--isolation", "container",
                 "--image", "pytorch:2.4", "--", "python", "train.py", "--lr", "0.1"]) == 0
    assert sent_bodies(gw) == [{
        "name": "train", "team": "research", "gpus": 2, "max_runtime_s": 7200.0,
        "command": ["python", "train.py", "--lr", "0.1"], "env": {"A": "1", "B": "x=y"},
        "limits": {"cpu_milli": 2000, "memory_mib": 16384, "pids": 256},
        "restart": {"policy": "on_failure", "attempts": 3, "delay_s": 30.0}, "stop_grace_s": 60.0,
        "warn_before_s": 300.0, "workdir": "/scratch/t", "stop_signal": "SIGINT", "warn_signal": "SIGUSR2",
        "isolation": "container", "image": "pytorch:2.4"}]
    out = capsys.readouterr().out
    assert "runs: python train.py --lr 0.1" in out and "gpupool logs -f j9" in out


def test_submit_reads_the_work_from_the_yaml_file_and_flags_win(gw, tmp_path):
    gw.on("POST", "/v1/jobs", echo_submission)
    (tmp_path / "job.yaml").write_text(
        "name: ft\nteam: research\ngpus: 1\ncommand: [python, train.py]\nenv: {EPOCHS: 3, DEBUG: true}\n"
        "limits: {memory_mib: 8GiB}\nrestart: {policy: on_failure, attempts: 2}\nstop-grace: 10s\n")
    assert main(["submit", "-f", str(tmp_path / "job.yaml"), "--env", "EPOCHS=5", "--pids", "64"]) == 0
    assert main(["submit", "-f", str(tmp_path / "job.yaml"), "--", "python", "eval.py"]) == 0
    first, second = sent_bodies(gw)
    assert first["command"] == ["python", "train.py"] and first["env"] == {"EPOCHS": "5", "DEBUG": "true"}
    assert first["limits"] == {"memory_mib": 8192, "pids": 64} and first["stop_grace_s"] == 10.0
    assert first["restart"] == {"policy": "on_failure", "attempts": 2}
    assert second["command"] == ["python", "eval.py"]


def test_describe_shows_the_command_the_exit_code_and_the_reason(gw, capsys):
    gw.on("GET", "/v1/jobs/j1", job("j1", state="failed", work=WORK_DOC, exit_code=7, reason="NonZeroExit"))
    gw.on("GET", "/v1/allocations", {"items": [], "next": None})
    assert main(["describe", "j1"]) == 0
    out = capsys.readouterr().out
    assert "Command:     sh -c 'echo hi'" in out and "Exit code:   7" in out and "Reason:      NonZeroExit" in out


def test_a_commandless_submit_sends_no_work_fields(gw):
    gw.on("POST", "/v1/jobs", echo_submission)
    assert main(["submit", "--name", "hold", "--team", "research", "--gpus", "1"]) == 0
    assert sent_bodies(gw) == [{"name": "hold", "team": "research", "gpus": 1}]


@pytest.mark.parametrize("argv, needle", [
    (["--env", "A=1"], "env need a command"),
    (["--memory-mib", "1GiB"], "limits need a command"),
    (["--env", "NOEQUALS", "--", "true"], "--env expects NAME=VALUE"),
    (["--restart", "sometimes", "--", "true"], "restart must be"),
    (["--restart", "on_failure:0", "--", "true"], "restart must be"),
    (["--memory-mib", "lots", "--", "true"], "GPU memory must be"),
    (["--stop-grace", "soon", "--", "true"], "not a duration"),
])
def test_bad_work_flags_are_usage_errors(gw, capsys, argv, needle):
    assert main(["submit", "--name", "a", "--team", "t", "--gpus", "1", *argv]) == 2
    assert needle in capsys.readouterr().err
    assert gw.calls == []


def test_a_command_in_a_file_must_be_a_list(gw, capsys, tmp_path):
    (tmp_path / "job.yaml").write_text("name: a\nteam: t\ngpus: 1\ncommand: echo hi\n")
    assert main(["submit", "-f", str(tmp_path / "job.yaml")]) == 2
    assert "list of arguments" in capsys.readouterr().err


def test_the_gateways_refusal_of_a_work_field_is_exit_1(gw, capsys):
    gw.on("POST", "/v1/jobs", problem(422, "InvalidRequest", "env: env name '1X' is not [A-Za-z_][A-Za-z0-9_]*"))
    assert main(["submit", "--name", "a", "--team", "t", "--gpus", "1", "--env", "1X=y", "--", "true"]) == 1
    assert "InvalidRequest" in capsys.readouterr().err


# --- pure pieces ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("state, code, reason, message, interrupted, expected", [
    ("completed", 0, "Completed", None, False, 0),
    ("completed", None, None, None, False, 0),
    ("failed", 7, "NonZeroExit", "exited with code 7", False, 7),
    ("failed", 300, "NonZeroExit", None, False, 255),
    ("failed", None, "Signalled", "killed by SIGKILL", False, 137),
    ("failed", None, "Signalled", "killed by SIGTERM", False, 143),
    ("failed", -11, "Signalled", None, False, 139),
    ("failed", None, "MaxRuntimeExceeded", "stopped with signal 15 after max_runtime_s", False, 143),
    ("failed", None, "OutOfMemory", "killed by the memory controller (out of memory)", False, 137),
    ("failed", None, "CommandNotFound", "no such program: trian.py", False, 1),
    ("failed", 0, "GangMemberFailed", None, False, 1),
    ("failed", None, None, None, False, 1),
    ("cancelled", None, "CancelledByUser", None, True, 130),
    ("cancelled", 143, "CancelledByUser", "killed by SIGTERM", False, 1),
])
def test_exit_status(state, code, reason, message, interrupted, expected):
    assert work.exit_status(state, code, reason, message, interrupted=interrupted) == expected


def test_signal_numbers_are_read_from_names_and_numbers():
    assert work.signal_number("killed by SIGINT") == 2
    assert work.signal_number(None, "terminated by signal 9") == 9
    assert work.signal_number("SIGNOTREAL then nothing") is None


@pytest.mark.parametrize("text, expected", [
    ("never", {"policy": "never"}),
    ("on_failure:3", {"policy": "on_failure", "attempts": 3}),
    ("on-failure:2:1m", {"policy": "on_failure", "attempts": 2, "delay_s": 60.0}),
])
def test_parse_restart(text, expected):
    assert work.parse_restart(text) == expected


def test_default_names_come_from_the_program():
    assert work.default_name(["python", "train.py"]) == "run-python"
    assert work.default_name(["/usr/bin/My_Tool++"]) == "run-my_tool"
    assert work.default_name(["./--"]) == "run"


def test_run_builds_its_request_from_the_dashes_alone():
    args = build_parser().parse_args(["run", "--", "sh", "-c", "echo hi; exit 7"])
    spec, body = work.job_request(args, run=True, team_of_token=lambda: "research")
    assert spec == {"name": "run-sh", "team": "research", "gpus": 1}
    assert body == {"command": ["sh", "-c", "echo hi; exit 7"]}
    args = build_parser().parse_args(["run", "--gang-nodes", "2", "--gpus-per-node", "8", "--team", "t", "--",
                                      "torchrun", "x.py"])
    spec, _ = work.job_request(args, run=True)
    assert spec["gpus"] == 16 and spec["team"] == "t"


def test_run_needs_a_command_and_a_team(gw, capsys):
    assert main(["run", "--team", "t"]) == 2
    assert "needs the command after --" in capsys.readouterr().err
    gw.on("GET", "/v1/whoami", {"subject": "admin", "role": "platform-admin", "team": None, "allowed": []})
    assert main(["run", "--", "true"]) == 2
    assert "missing --team" in capsys.readouterr().err


# --- gpupool run end to end against the fake gateway -----------------------------------------------------------
def states(*docs: dict[str, Any]) -> Any:
    """GET /v1/jobs/j9 answers these in turn, then the last one forever."""
    left = list(docs)
    return lambda _req: left.pop(0) if len(left) > 1 else left[0]


def logs_by_stream(stdout: str, stderr: str) -> Any:
    def answer(req: httpx.Request) -> httpx.Response:
        assert req.url.params["follow"] == "true"
        text = {"stdout": stdout, "stderr": stderr}[req.url.params["stream"]]
        return httpx.Response(200, text=text, headers={"content-type": "text/plain; charset=utf-8"})
    return answer


def test_run_streams_both_outputs_apart_and_exits_with_the_works_code(gw, capsys):
    gw.on("GET", "/v1/whoami", {"subject": "alice", "role": "member", "team": "research", "allowed": []})
    gw.on("POST", "/v1/jobs", echo_submission)
    gw.on("GET", "/v1/jobs/j9", states(job("j9", state="pending"), job("j9", state="launching"),
                                       job("j9", state="running", work=WORK_DOC),
                                       job("j9", state="failed", exit_code=7, reason="NonZeroExit",
                                           message="exited with code 7")))
    gw.on("GET", "/v1/jobs/j9/logs", logs_by_stream("hi\n", "oops\n"))
    assert main(["run", "--", "sh", "-c", "echo hi; echo oops >&2; exit 7"]) == 7
    body = sent_bodies(gw)[0]
    assert body == {"name": "run-sh", "team": "research", "gpus": 1,
                    "command": ["sh", "-c", "echo hi; echo oops >&2; exit 7"]}
    captured = capsys.readouterr()
    assert captured.out == "hi\n"  # nothing but the work's stdout
    assert "oops\n" in captured.err and "gpupool: submitted job j9" in captured.err
    assert "gpupool: job j9 failed (NonZeroExit): exit 7" in captured.err


def test_run_quiet_prints_only_the_work(gw, capsys):
    gw.on("POST", "/v1/jobs", echo_submission)
    gw.on("GET", "/v1/jobs/j9", job("j9", state="completed", exit_code=0, reason="Completed"))
    gw.on("GET", "/v1/jobs/j9/logs", logs_by_stream("done\n", ""))
    assert main(["run", "-q", "--team", "research", "--gpus", "2", "--", "true"]) == 0
    assert capsys.readouterr() == ("done\n", "")


# --- the runner: Ctrl-C, streams that fail ----------------------------------------------------------------------
class FakeClient:
    """The client calls the runner makes, scripted: get_job answers `jobs` in turn (raising any exception in it)."""

    def __init__(self, jobs: list[Any], output: dict[str, list[Any]] | None = None) -> None:
        self.jobs, self.output = jobs, output or {}
        self.cancelled: list[str] = []
        self.follows: list[str] = []

    def get_job(self, job_id: str) -> Job:
        item = self.jobs.pop(0) if len(self.jobs) > 1 else self.jobs[0]
        if isinstance(item, BaseException):
            raise item
        return Job.from_api(item)

    def cancel_job(self, job_id: str, reason: str | None = None) -> Job:
        self.cancelled.append(reason or "")
        return Job.from_api(job("j9", state="cancelled"))

    def follow_logs(self, job_id: str, *, stream: str = "both", **_: Any) -> Iterator[str]:
        self.follows.append(stream)
        for item in self.output.get(stream, []):
            if isinstance(item, BaseException):
                raise item
            yield item


def runner(gp: FakeClient) -> tuple[work.Runner, io.StringIO, io.StringIO]:
    out, err = io.StringIO(), io.StringIO()
    return work.Runner(gp, "j9", poll_s=0, out=out, err=err, sleep=lambda _s: None), out, err  # type: ignore[arg-type]


def test_the_first_ctrl_c_cancels_the_job_and_waits_for_its_end():
    gp = FakeClient([job("j9", state="pending"), KeyboardInterrupt(), job("j9", state="cancelled")])
    r, _, err = runner(gp)
    assert r.run() == 130
    assert gp.cancelled == ["cancelled by gpupool run (Ctrl-C)"]
    assert "Ctrl-C again to exit at once" in err.getvalue()


def test_a_second_ctrl_c_exits_at_once():
    gp = FakeClient([job("j9", state="running"), KeyboardInterrupt(), KeyboardInterrupt()],
                    {"stdout": ["a\n"]})
    r, _, err = runner(gp)
    r.started = True  # interrupted while waiting for the end
    assert r.run() == 130
    assert len(gp.cancelled) == 1 and "exiting now" in err.getvalue()


def test_a_cancel_by_someone_else_is_exit_1():
    gp = FakeClient([job("j9", state="cancelled", reason="CancelledByUser")])
    r, _, _ = runner(gp)
    assert r.run() == 1 and gp.cancelled == []


def test_a_stream_that_fails_before_any_output_is_retried_and_one_lost_midway_is_reported():
    gp = FakeClient([job("j9", state="running"), job("j9", state="completed")],
                    {"stdout": ["part", GpupoolError(0, "Unreachable", "lost the log stream")]})
    flaky = {"n": 0}
    original = gp.follow_logs

    def follow(job_id: str, *, stream: str = "both", **kw: Any) -> Iterator[str]:
        if stream == "stderr" and flaky["n"] == 0:
            flaky["n"] += 1
            raise GpupoolError(503, "AgentUnavailable", "not yet")
        return original(job_id, stream=stream, **kw)

    gp.follow_logs = follow  # type: ignore[method-assign]
    r, out, err = runner(gp)
    assert r.run() == 0
    assert out.getvalue() == "part"
    assert gp.follows.count("stderr") == 1 and flaky["n"] == 1  # the 503 was asked again
    assert "log stream ended early (stdout: Unreachable: lost the log stream)" in err.getvalue()


# --- gpupool logs ------------------------------------------------------------------------------------
def test_logs_passes_its_options_and_prints_the_text(gw, capsys):
    gw.on("GET", "/v1/jobs/j1/logs", lambda req: httpx.Response(200, text="[replica 1] x\n"))
    assert main(["logs", "j1", "--replica", "1", "--attempt", "0", "--stream", "stderr", "--tail", "5"]) == 0
    assert capsys.readouterr().out == "[replica 1] x\n"
    params = gw.calls[0].url.params
    assert (params["replica"], params["attempt"], params["stream"], params["tail"]) == ("1", "0", "stderr", "5")
    assert "follow" not in params
    assert main(["logs", "-f", "j1"]) == 0
    assert gw.calls[1].url.params["follow"] == "true" and gw.calls[1].url.params["stream"] == "both"


def test_logs_problems_are_one_line_and_exit_1(gw, capsys):
    gw.on("GET", "/v1/jobs/j1/logs", problem(404, "NoLogs", "job j1 runs no command"))
    assert main(["logs", "j1"]) == 1
    assert capsys.readouterr().err == "error: NoLogs: job j1 runs no command (HTTP 404)\n"
    assert main(["logs", "-f", "j1"]) == 1
    assert "NoLogs" in capsys.readouterr().err


# --- completion -----------------------------------------------------------------------------------------------------
def test_completion_knows_run_logs_and_the_work_flags(capsys):
    spec = completion.completion_spec(build_parser())
    assert {"submit", "run", "logs"} <= set(spec[""]["words"])
    assert {"--env", "--restart", "--isolation", "--memory-mib"} <= set(spec["run"]["takes_value"])
    assert {"--env", "--workdir", "--stop-signal"} <= set(spec["submit"]["takes_value"])
    assert spec["run"]["choices"]["--isolation"] == ["process", "sandbox", "container"]
    assert spec["logs"]["choices"]["--stream"] == ["stdout", "stderr", "both"]
    assert "--follow" in spec["logs"]["options"] and "--follow" not in spec["logs"]["takes_value"]
    assert "launching" in spec["jobs"]["choices"]["--state"]
    for shell in ("bash", "zsh"):
        assert main(["completion", shell]) == 0
        script = capsys.readouterr().out
        assert '"run"' in script and '"logs"' in script and "--stop-grace" in script


def test_run_polls_soon_then_backs_off_to_its_ceiling() -> None:
    pauses = []
    runner = work.Runner(None, "j1", poll_s=0.5, sleep=pauses.append)  # type: ignore[arg-type]
    it = runner._pauses()
    first = [next(it) for _ in range(12)]
    assert first[0] == work.FIRST_POLL_S and first == sorted(first) and first[-1] == 0.5
    assert all(b <= a * 1.5 + 1e-9 for a, b in zip(first, first[1:], strict=False))
