"""POST /v1/jobs with the work fields: accepted and forwarded into SubmitJob; inconsistent work refused at the edge
with a 422 problem body, before anything reaches the queue."""

from __future__ import annotations

from typing import Any

import pytest
from gateway_fakes import app, bus, client  # noqa: F401  (fixtures)

BASE = {"name": "train", "team": "research", "gpus": 1}


async def post(app: Any, body: dict[str, Any], token: str = "admin") -> Any:  # noqa: F811
    async with client(app, token) as c:
        return await c.post("/v1/jobs", json=body)


async def test_work_fields_are_forwarded_into_submit_job(app, bus) -> None:  # noqa: F811
    body = {**BASE, "command": ["sh", "-c", "echo hi; exit 7"], "env": {"EPOCHS": "3", "_x": ""},
            "workdir": "/scratch/train", "limits": {"cpu_milli": 2000, "memory_mib": 4096, "pids": 512},
            "stop_signal": "SIGINT", "stop_grace_s": 5, "max_runtime_s": 3600, "warn_before_s": 60,
            "warn_signal": "SIGUSR2", "restart": {"policy": "on_failure", "attempts": 2, "delay_s": 1.5}}
    resp = await post(app, body, "alice")
    assert resp.status_code == 201, resp.text
    (cmd,) = bus.submitted()
    assert cmd.command == ["sh", "-c", "echo hi; exit 7"]
    assert cmd.env == {"EPOCHS": "3", "_x": ""} and cmd.workdir == "/scratch/train"
    assert (cmd.limits.cpu_milli, cmd.limits.memory_mib, cmd.limits.pids) == (2000, 4096, 512)
    assert (cmd.stop_signal, cmd.stop_grace_s, cmd.warn_before_s, cmd.warn_signal) == ("SIGINT", 5, 60, "SIGUSR2")
    assert (cmd.restart.policy, cmd.restart.attempts, cmd.restart.delay_s) == ("on_failure", 2, 1.5)
    assert cmd.submitted_by == "alice" and cmd.isolation == "process"
    spec = cmd.work_spec()
    assert spec is not None and spec.command[0] == "sh"


async def test_a_container_job_names_its_image(app, bus) -> None:  # noqa: F811
    resp = await post(app, {**BASE, "command": ["python", "-V"], "isolation": "container",
                            "image": "pytorch/pytorch:2.4"})
    assert resp.status_code == 201, resp.text
    assert bus.submitted()[0].image == "pytorch/pytorch:2.4"


async def test_a_commandless_job_still_only_holds_gpus(app, bus) -> None:  # noqa: F811
    resp = await post(app, BASE)
    assert resp.status_code == 201
    (cmd,) = bus.submitted()
    assert cmd.command is None and cmd.work_spec() is None


@pytest.mark.parametrize(("extra", "needle"), [
    ({"command": ["true"], "env": {"1BAD": "x"}}, "env name"),
    ({"command": ["true"], "env": {"BAD-NAME": "x"}}, "env name"),
    ({"command": ["true"], "env": {"CUDA_VISIBLE_DEVICES": "0"}}, "set by the grant"),
    ({"command": ["true"], "env": {"GPUPOOL_NODE": "x"}}, "set by the grant"),
    ({"env": {"A": "1"}}, "need a command"),
    ({"workdir": "/tmp"}, "need a command"),
    ({"limits": {"memory_mib": 64}}, "need a command"),
    ({"command": []}, "command"),
    ({"command": [""]}, "command[0]"),
    ({"command": ["true"], "workdir": "relative/dir"}, "absolute"),
    ({"command": ["true"], "workdir": "/a/../etc"}, "absolute"),
    ({"command": ["true"], "isolation": "container"}, "image or rootfs"),
    ({"command": ["true"], "image": "ubuntu:24.04"}, "isolation container"),
    ({"command": ["true"], "isolation": "vm"}, "isolation"),
    ({"command": ["true"], "stop_signal": "SIGSEGV"}, "stop_signal"),
    ({"command": ["true"], "restart": {"policy": "on_failure"}}, "attempts"),
    ({"command": ["true"], "limits": {"memory_mib": 1}}, "memory_mib"),
    ({"command": ["true"], "warn_before_s": 30}, "warn_before_s needs max_runtime_s"),
    ({"command": ["true"], "warn_before_s": 30, "max_runtime_s": 30}, "less than max_runtime_s"),
    ({"cmd": ["true"]}, "cmd"),
    ({"command": "echo hi"}, "command"),
])
async def test_inconsistent_work_is_a_422_problem(app, bus, extra, needle) -> None:  # noqa: F811
    resp = await post(app, {**BASE, **extra})
    assert resp.status_code == 422, resp.text
    assert resp.headers["content-type"] == "application/problem+json"
    problem = resp.json()
    assert problem["reason"] == "InvalidRequest"
    assert needle in problem["detail"] or any(needle in str(e) for e in problem.get("errors", [])), problem
    assert bus.submitted() == []


def test_the_openapi_document_shows_a_submission_with_a_command(app) -> None:  # noqa: F811
    schema = app.openapi()["components"]["schemas"]["JobRequestBody"]
    assert {"command", "env", "workdir", "limits", "restart", "isolation"} <= set(schema["properties"])
    assert any("command" in example for example in schema["examples"])
    logs = app.openapi()["paths"]["/v1/jobs/{job_id}/logs"]["get"]
    text = logs["responses"]["200"]["content"]["text/plain"]  # one media type: the schema with its examples
    assert text["schema"] == {"type": "string"} and "one replica" in text["examples"]
