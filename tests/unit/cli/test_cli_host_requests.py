"""`gpupool submit --cpu --memory --selector --preemptible` (and the same keys in a -f file): the body the gateway
gets, usage errors before anything is sent, and what `describe` shows."""

from __future__ import annotations

import json

import httpx
import pytest
from cli_fakes import FakeGateway, job

from libs.cli import common
from libs.cli.main import main
from libs.client import GpupoolClient


@pytest.fixture()
def gw(monkeypatch) -> FakeGateway:
    fake = FakeGateway()
    monkeypatch.setattr(common, "make_client", lambda args: GpupoolClient(
        args.url or "http://gw.test", args.token or "tok", transport=fake.transport, sleep=lambda _s: None))
    return fake


def echo(req: httpx.Request) -> httpx.Response:
    return httpx.Response(201, json=job("j1", **json.loads(req.content)))


def test_host_flags_reach_the_gateway_in_the_bodys_terms(gw, capsys):
    gw.on("POST", "/v1/jobs", echo)
    assert main(["submit", "--name", "a", "--team", "research", "--gpus", "1", "--cpu", "4.5", "--memory", "64GiB",
                 "--selector", "zone=west", "--selector", "example.com/disk=nvme", "--no-preemptible"]) == 0
    assert json.loads(gw.calls[0].content) == {
        "name": "a", "team": "research", "gpus": 1, "cpu_milli": 4500, "memory_mib": 65536,
        "node_selector": {"zone": "west", "example.com/disk": "nvme"}, "preemptible": False}
    assert main(["submit", "--name", "b", "--team", "research", "--gpus", "1", "--cpu", "500m",
                 "--preemptible"]) == 0
    assert json.loads(gw.calls[1].content) == {"name": "b", "team": "research", "gpus": 1, "cpu_milli": 500,
                                               "preemptible": True}
    assert main(["submit", "--name", "c", "--team", "research", "--gpus", "1"]) == 0  # none: nothing sent
    assert json.loads(gw.calls[2].content) == {"name": "c", "team": "research", "gpus": 1}


def test_a_file_gives_them_too_and_flags_win(gw, tmp_path):
    gw.on("POST", "/v1/jobs", echo)
    (tmp_path / "job.yaml").write_text("name: f\nteam: research\ngpus: 2\ncpu: 8\nmemory: 16GiB\n"
                                       "node_selector: {zone: east, ssd: true}\npreemptible: true\n")
    assert main(["submit", "-f", str(tmp_path / "job.yaml"), "--cpu", "2"]) == 0
    assert json.loads(gw.calls[0].content) == {
        "name": "f", "team": "research", "gpus": 2, "cpu_milli": 2000, "memory_mib": 16384,
        "node_selector": {"zone": "east", "ssd": "true"}, "preemptible": True}


@pytest.mark.parametrize(("flags", "needle"), [
    (["--cpu", "lots"], "cpu must be cores"),
    (["--cpu", "0"], "more than 0"),
    (["--memory", "a lot"], "memory"),
    (["--selector", "zone"], "KEY=VALUE"),
    (["--selector", "=a"], "KEY=VALUE"),
])
def test_bad_host_flags_are_usage_errors_and_nothing_is_sent(gw, capsys, flags, needle):
    assert main(["submit", "--name", "a", "--team", "research", "--gpus", "1", *flags]) != 0
    assert needle in capsys.readouterr().err
    assert gw.calls == []


def test_describe_shows_what_the_job_asks_of_its_nodes(gw, capsys):
    gw.on("GET", "/v1/jobs/j1", job("j1", cpu_milli=4000, memory_mib=65536, node_selector={"zone": "a", "b": "c"},
                                    preemptible=False))
    gw.on("GET", "/v1/allocations", {"items": [], "next": None})
    assert main(["describe", "j1"]) == 0
    out = capsys.readouterr().out
    assert "Host:        4 CPU, 64.0 GiB per node" in out
    assert "Selector:    b=c,zone=a" in out and "Preemptible: no" in out


def test_describe_shows_the_jobs_trace_as_a_link_when_a_template_says_where(gw, capsys, monkeypatch):
    trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"
    gw.on("GET", "/v1/jobs/j1", job("j1", trace_id=trace_id))
    gw.on("GET", "/v1/allocations", {"items": [], "next": None})
    monkeypatch.delenv("GPUPOOL_TRACE_URL_TEMPLATE", raising=False)
    assert main(["describe", "j1"]) == 0
    assert f"Trace:       {trace_id}" in capsys.readouterr().out
    monkeypatch.setenv("GPUPOOL_TRACE_URL_TEMPLATE", "http://jaeger:16686/trace/{trace_id}")
    assert main(["describe", "j1"]) == 0
    assert f"Trace:       http://jaeger:16686/trace/{trace_id}" in capsys.readouterr().out
    assert main(["describe", "j1", "-o", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["trace_id"] == trace_id
