"""`gpupool endpoints`, `gpupool load`, `gpupool update`, and a service submitted from YAML, against the fake
gateway: the requests they send and what they print."""

from __future__ import annotations

import json

import httpx
import pytest
from cli_fakes import FakeGateway, job

from libs.cli import common
from libs.cli.main import main
from libs.client import GpupoolClient

ENDPOINTS = {"job_id": "svc", "items": [
    {"replica": 0, "node": "sim-node-0", "cluster": "local", "allocation_id": "a0", "url": "http://127.0.0.2:4100",
     "ports": {"http": 4100}, "ready": True, "since": "2026-12-01T22:00:00+00:00", "reason": None},
    {"replica": 1, "node": "sim-node-1", "cluster": "local", "allocation_id": "a1", "url": "http://127.0.0.3:4200",
     "ports": {"http": 4200}, "ready": False, "since": "2026-12-01T22:00:05+00:00", "reason": "HealthCheckFailed"}]}


@pytest.fixture()
def gw(monkeypatch) -> FakeGateway:
    fake = FakeGateway()
    monkeypatch.setattr(common, "make_client", lambda args: GpupoolClient(
        args.url or "http://gw.test", args.token or "tok", transport=fake.transport, sleep=lambda _s: None))
    return fake


def test_endpoints_lists_each_replica_and_how_many_are_ready(gw, capsys) -> None:
    gw.on("GET", "/v1/jobs/svc/endpoints", ENDPOINTS)
    assert main(["endpoints", "svc"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("1 of 2 replica(s) ready")
    assert "http://127.0.0.2:4100" in out and "HealthCheckFailed" in out
    assert main(["endpoints", "svc", "-o", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["items"][1]["ready"] is False


def test_load_posts_the_value_and_the_reporter(gw, capsys) -> None:
    gw.on("POST", "/v1/jobs/svc/load", lambda req: {**json.loads(req.content), "job_id": "svc",
                                                    "at": "2026-12-01T22:00:00+00:00"})
    assert main(["load", "svc", "37", "--reporter", "replica-0"]) == 0
    assert json.loads(gw.calls[-1].content) == {"value": 37.0, "reporter": "replica-0"}
    assert "load 37 from replica-0" in capsys.readouterr().out
    assert main(["load", "svc", "-1"]) != 0  # a usage error, nothing sent
    assert len(gw.calls) == 1


def test_update_sends_the_new_env_and_command_as_one_patch(gw, capsys) -> None:
    gw.on("PATCH", "/v1/jobs/svc", lambda req: job("svc", state="running", work={
        "command": json.loads(req.content).get("command", ["serve"]), "env": json.loads(req.content)["env"]}))
    assert main(["update", "--env", "MODEL=v2", "svc", "--", "serve", "--port", "80"]) == 0
    assert json.loads(gw.calls[-1].content) == {"command": ["serve", "--port", "80"], "env": {"MODEL": "v2"}}
    out = capsys.readouterr().out
    assert "rolling out" in out and "env: MODEL=v2" in out
    assert main(["update", "svc"]) != 0  # nothing to update
    assert len(gw.calls) == 1


def test_a_service_submitted_from_yaml_carries_its_ports_health_and_autoscale(gw, tmp_path) -> None:
    gw.on("POST", "/v1/jobs", lambda req: httpx.Response(201, json=job("s1", **{
        **json.loads(req.content), "state": "pending"})))
    (tmp_path / "svc.yaml").write_text(
        "name: chat\nteam: inference\ngpus: 1\nkind: inference\nreplicas: 2\nmin_replicas: 2\nmax_replicas: 4\n"
        "autoscale: {target: 10, scale_down_stabilization_s: 60}\ncommand: [python3, serve.py]\n"
        "ports: [http]\nhealth: {http: /healthz, interval_s: 2}\n")
    assert main(["submit", "-f", str(tmp_path / "svc.yaml")]) == 0
    body = json.loads(gw.calls[-1].content)
    assert (body["replicas"], body["min_replicas"], body["max_replicas"]) == (2, 2, 4)
    assert body["autoscale"] == {"target": 10, "scale_down_stabilization_s": 60}
    assert body["ports"] == ["http"] and body["health"] == {"http": "/healthz", "interval_s": 2}
