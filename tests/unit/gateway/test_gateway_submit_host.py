"""POST /v1/jobs with host CPU/memory, a node selector and a preemptible override: forwarded into SubmitJob; out of
range values and selectors that are not Kubernetes labels refused at the edge with a 422 problem body."""

from __future__ import annotations

from typing import Any

import pytest
from gateway_fakes import app, bus, client  # noqa: F401  (fixtures)
from pydantic import ValidationError

from libs.contracts.commands import MAX_JOB_CPU_MILLI, SubmitJob
from libs.contracts.envelope import utcnow
from libs.contracts.events import JobSubmitted
from libs.contracts.labels import MAX_SELECTOR, label_problem, parse_labels

BASE = {"name": "train", "team": "research", "gpus": 1}


async def post(app: Any, body: dict[str, Any]) -> Any:  # noqa: F811
    async with client(app, "admin") as c:
        return await c.post("/v1/jobs", json=body)


async def test_host_resources_selector_and_preemptible_are_forwarded(app, bus) -> None:  # noqa: F811
    body = {**BASE, "cpu_milli": 16_000, "memory_mib": 65_536, "preemptible": False,
            "node_selector": {"zone": "a", "example.com/disk": "nvme", "gpupool.io/tier": ""}}
    resp = await post(app, body)
    assert resp.status_code == 201, resp.text
    (cmd,) = bus.submitted()
    assert (cmd.cpu_milli, cmd.memory_mib, cmd.preemptible) == (16_000, 65_536, False)
    assert cmd.node_selector == {"zone": "a", "example.com/disk": "nvme", "gpupool.io/tier": ""}


async def test_left_out_they_ask_for_nothing_and_leave_preemption_to_the_class(app, bus) -> None:  # noqa: F811
    assert (await post(app, BASE)).status_code == 201
    (cmd,) = bus.submitted()
    assert (cmd.cpu_milli, cmd.memory_mib, cmd.node_selector, cmd.preemptible) == (0, 0, {}, None)


@pytest.mark.parametrize(("extra", "needle"), [
    ({"cpu_milli": -1}, "cpu_milli"),
    ({"cpu_milli": MAX_JOB_CPU_MILLI + 1}, "cpu_milli"),
    ({"cpu_milli": 1.5}, "cpu_milli"),
    ({"memory_mib": -5}, "memory_mib"),
    ({"memory_mib": 2**40}, "memory_mib"),
    ({"preemptible": "sometimes"}, "preemptible"),
    ({"node_selector": {"zone": "a b"}}, "value"),
    ({"node_selector": {"-zone": "a"}}, "name must be"),
    ({"node_selector": {"": "a"}}, "name must be"),
    ({"node_selector": {"Example.COM/zone": "a"}}, "prefix"),
    ({"node_selector": {"/zone": "a"}}, "prefix"),
    ({"node_selector": {"a/b/c": "a"}}, "prefix"),
    ({"node_selector": {"x" * 64: "a"}}, "name must be"),
    ({"node_selector": {"zone": "v" * 64}}, "value"),
    ({"node_selector": {"zone": 3}}, "node_selector"),
    ({"node_selector": ["zone=a"]}, "node_selector"),
    ({"node_selector": {f"k{i}": "v" for i in range(MAX_SELECTOR + 1)}}, "node_selector"),
])
async def test_bad_host_requests_and_selectors_are_a_422_problem(app, bus, extra, needle) -> None:  # noqa: F811
    resp = await post(app, {**BASE, **extra})
    assert resp.status_code == 422, resp.text
    assert resp.headers["content-type"] == "application/problem+json"
    problem = resp.json()
    assert problem["reason"] == "InvalidRequest"
    assert needle in problem["detail"] or any(needle in str(e) for e in problem.get("errors", [])), problem
    assert bus.submitted() == []


def test_the_label_rules_are_kubernetes_ones() -> None:
    for key, value in (("zone", "a"), ("topology.kubernetes.io/zone", "eu-west-1a"), ("a", ""),
                       ("gpupool.io/isolation.sandbox", "true"), ("x" * 63, "y" * 63), ("A_b.C-d", "Z9")):
        assert label_problem(key, value) is None, (key, value)
    for key, value in (("zone", "-a"), ("zone", "a_"), ("zone_", "a"), ("UPPER.Case/x", "a"), ("a..b/x", "a"),
                       (("a" * 254) + "/x", "a")):
        assert label_problem(key, value) is not None, (key, value)
    assert parse_labels(" zone=a, disk = nvme ,") == {"zone": "a", "disk": "nvme"}
    with pytest.raises(ValueError, match="KEY=VALUE"):
        parse_labels("zone")


def test_the_bus_refuses_what_the_edge_refuses() -> None:
    with pytest.raises(ValidationError):
        SubmitJob(name="a", team="t", gpus=1, node_selector={"bad key": "x"})
    with pytest.raises(ValidationError):
        JobSubmitted(job_id="j", name="a", team="t", project="p", kind="batch", priority_class="normal",
                     priority=0, gpus=1, submitted_at=utcnow(), node_selector={"zone": "a b"})
    with pytest.raises(ValidationError):
        JobSubmitted(job_id="j", name="a", team="t", project="p", kind="batch", priority_class="normal",
                     priority=0, gpus=1, submitted_at=utcnow(), cpu_milli=-1)
    ok = JobSubmitted(job_id="j", name="a", team="t", project="p", kind="batch", priority_class="normal",
                      priority=0, gpus=1, submitted_at=utcnow(), cpu_milli=2000, node_selector={"zone": "a"},
                      preemptible=True)
    assert (ok.cpu_milli, ok.node_selector, ok.preemptible) == (2000, {"zone": "a"}, True)
