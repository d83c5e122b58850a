"""The typed client's work calls against the fake gateway: submit with the work fields, logs, follow_logs (streamed,
never retried), and the models' new fields (work, exit_code, reason, attempt)."""

from __future__ import annotations

import json

import httpx
import pytest
from cli_fakes import FakeGateway, allocation, job, problem

from libs.client import GpupoolClient, GpupoolError
from libs.client.models import Allocation, Job

WORK_DOC = {"command": ["sh", "-c", "echo hi"], "env": {}, "limits": {}, "restart": {"policy": "never"}}


def echo_submission(req: httpx.Request) -> httpx.Response:
    return httpx.Response(201, json=job("j9", **{**json.loads(req.content), "state": "pending"}))


def test_client_submit_types_the_work_fields():
    gw = FakeGateway()
    gw.on("POST", "/v1/jobs", echo_submission)
    gp = GpupoolClient("http://gw.test", "tok", transport=gw.transport)
    got = gp.submit("train", "research", command=["python", "t.py"], env={"A": "1"},
                    limits={"memory_mib": 4096, "pids": None}, restart={"policy": "on_failure", "attempts": 1},
                    kind="training", max_runtime_s=60.0, warn_before_s=10.0)
    assert json.loads(gw.calls[0].content) == {
        "name": "train", "team": "research", "gpus": 1, "command": ["python", "t.py"], "env": {"A": "1"},
        "limits": {"memory_mib": 4096}, "restart": {"policy": "on_failure", "attempts": 1}, "warn_before_s": 10.0,
        "kind": "training", "max_runtime_s": 60.0}
    assert got.job_id == "j9" and "Idempotency-Key" in gw.calls[0].headers
    with pytest.raises(TypeError, match="argv list"):
        gp.submit("x", "t", command="echo hi")  # type: ignore[arg-type]


def test_client_follow_logs_yields_text_and_raises_problems():
    gw = FakeGateway()
    gw.on("GET", "/v1/jobs/j1/logs", lambda req: httpx.Response(200, text="a\nb\n"))
    gw.on("GET", "/v1/jobs/j2/logs", problem(503, "AgentUnavailable", "the agent did not answer"))
    gp = GpupoolClient("http://gw.test", "tok", transport=gw.transport, sleep=lambda _s: None)
    assert "".join(gp.follow_logs("j1", tail=2)) == "a\nb\n"
    assert gw.calls[0].url.params["tail"] == "2" and gw.calls[0].url.params["follow"] == "true"
    with pytest.raises(GpupoolError) as info:
        list(gp.follow_logs("j2"))
    assert (info.value.status, info.value.reason) == (503, "AgentUnavailable")
    assert len([c for c in gw.calls if c.url.path == "/v1/jobs/j2/logs"]) == 1  # a follow is never retried
    assert gp.logs("j1") == "a\nb\n"


def test_the_models_carry_the_work_the_exit_and_the_attempt():
    j = Job.from_api(job("j1", state="launching", work=WORK_DOC, exit_code=3, reason="NonZeroExit"))
    assert j.work is not None and j.work.command == ["sh", "-c", "echo hi"] and j.work.restart.policy == "never"
    assert (j.exit_code, j.reason, j.finished) == (3, "NonZeroExit", False)
    assert Job.from_api(job("j1")).work is None
    assert Allocation.from_api(allocation("a1", "j1", [])).attempt == 0
    assert Allocation.from_api({**allocation("a1", "j1", []), "attempt": 2}).attempt == 2
