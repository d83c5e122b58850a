"""The job mapping on the agent's /metrics: `gpupool_gpu_allocation_info{UUID, Hostname, gpu, job_id, team, project,
allocation} 1`, one series per GPU and live allocation, from the grants the agent applies and its start-up query;
gone with the release; one per allocation on a GPU shared by fractions or MIG slices. Read back from the Prometheus
text a scrape returns."""

from __future__ import annotations

import asyncio
import subprocess
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from libs.contracts.events import AllocatedGpu, AllocationGranted, AllocationReleased, EventData, subject_for
from services.agent import handlers
from services.agent.dcgm_metrics import ALLOCATION_INFO, ALLOCATION_LABELS, DcgmMetrics
from services.agent.handlers import NodeAgent
from services.agent.nvml_sim import SimulatedNvml
from tests.ecosystem import debian_tool

T0 = datetime(2026, 1, 1, tzinfo=UTC)
RULES = Path(__file__).resolve().parents[3] / "deploy" / "prometheus" / "rules" / "gpu_jobs.yml"


class Agent(NodeAgent):
    def __init__(self, backend: SimulatedNvml, node: str, metrics: DcgmMetrics) -> None:
        super().__init__(SimpleNamespace(jetstream=lambda: None), backend, "local", node, 1.0,  # type: ignore[arg-type]
                         metrics=metrics)
        self.synced = True

    async def _publish(self, data: EventData, identity: str) -> bool:
        return True


class Msg:
    def __init__(self, data: EventData) -> None:
        self.data = data.to_cloudevent("/gpupool/placement").model_dump_json().encode()
        self.subject = subject_for(data)
        self.headers: dict[str, str] | None = None


def granted(allocation_id: str, node: str, gpus: list[AllocatedGpu], team: str = "research",
            project: str = "llm") -> AllocationGranted:
    return AllocationGranted(allocation_id=allocation_id, job_id=f"job-{allocation_id}", team=team, project=project,
                             cluster="local", node=node, gpus=gpus, granted_at=T0, kind="training")


def released(grant: AllocationGranted) -> AllocationReleased:
    return AllocationReleased(**grant.model_dump(include={"allocation_id", "job_id", "team", "project", "cluster",
                                                          "node", "gpus", "granted_at"}),
                              released_at=T0, reason="JobCompleted")


def info_series(registry: CollectorRegistry) -> list[dict[str, str]]:
    """The allocation info series of a scrape, each as its labels (every value asserted to be 1)."""
    text = generate_latest(registry).decode()
    assert f"# TYPE {ALLOCATION_INFO} gauge" in text
    found = []
    for family in text_string_to_metric_families(text):
        if family.name == ALLOCATION_INFO:
            for s in family.samples:
                assert s.value == 1.0, s
                found.append(s.labels)
    return sorted(found, key=lambda labels: (labels["Hostname"], labels["gpu"], labels["allocation"]))


@pytest.fixture
def node(clock):  # type: ignore[no-untyped-def]
    registry = CollectorRegistry()
    metrics = DcgmMetrics(registry)
    backend = SimulatedNvml("n0", ["H100-80GB"] * 4, seed=3, clock=clock)
    backend.open()
    agent = Agent(backend, "n0", metrics)
    return SimpleNamespace(registry=registry, metrics=metrics, backend=backend, agent=agent, clock=clock,
                           uuids=[g.uuid for g in backend.node_info().gpus])


def whole(uuids: list[str], *indexes: int) -> list[AllocatedGpu]:
    return [AllocatedGpu(uuid=uuids[i], index=i, model="H100-80GB") for i in indexes]


async def test_a_grant_adds_one_series_per_gpu_with_the_work_s_labels_and_its_release_removes_them(node) -> None:
    grant = granted("a1", "n0", whole(node.uuids, 1, 3), team="vision", project="detector")
    await node.agent._on_allocation(Msg(grant))
    assert info_series(node.registry) == [
        {"UUID": node.uuids[i], "Hostname": "n0", "gpu": str(i), "job_id": "job-a1", "team": "vision",
         "project": "detector", "allocation": "a1"} for i in (1, 3)]
    await node.agent.sample_once()  # the DCGM series of those GPUs keep their own labels only
    text = generate_latest(node.registry).decode()
    util = [s for f in text_string_to_metric_families(text) if f.name == "DCGM_FI_DEV_GPU_UTIL" for s in f.samples]
    assert len(util) == 4 and all("team" not in s.labels for s in util)

    await node.agent._on_allocation(Msg(released(grant)))
    assert info_series(node.registry) == []
    await node.agent._on_allocation(Msg(grant))  # a late redelivery of the grant does not bring them back
    assert info_series(node.registry) == []


async def test_a_shared_gpu_has_one_series_per_allocation_on_it(node) -> None:
    uuid = node.uuids[0]
    a = granted("f1", "n0", [AllocatedGpu(uuid=uuid, index=0, model="H100-80GB", share_milli=250, memory_mib=20000)],
                team="research")
    b = granted("f2", "n0", [AllocatedGpu(uuid=uuid, index=0, model="H100-80GB", share_milli=500, memory_mib=40000)],
                team="serving", project="chat")
    c = granted("w1", "n0", whole(node.uuids, 2), team="research")
    for grant in (a, b, c):
        await node.agent._on_allocation(Msg(grant))
    series = info_series(node.registry)
    assert [(s["gpu"], s["allocation"], s["team"], s["project"]) for s in series] == [
        ("0", "f1", "research", "llm"), ("0", "f2", "serving", "chat"), ("2", "w1", "research", "llm")]
    assert {s["UUID"] for s in series if s["gpu"] == "0"} == {uuid}
    await node.agent._on_allocation(Msg(released(a)))
    assert [s["allocation"] for s in info_series(node.registry)] == ["f2", "w1"]


async def test_mig_slices_of_one_gpu_each_carry_their_allocation(clock) -> None:
    registry = CollectorRegistry()
    backend = SimulatedNvml("m0", ["A100-80GB"], seed=3, clock=clock, mig_mode=[0])
    backend.open()
    agent = Agent(backend, "m0", DcgmMetrics(registry))
    uuid = backend.node_info().gpus[0].uuid
    for allocation_id, profile, start, team in (("s1", "3g.40gb", 4, "research"), ("s2", "2g.20gb", 0, "ops")):
        await agent._on_allocation(Msg(granted(allocation_id, "m0", [AllocatedGpu(
            uuid=uuid, index=0, model="A100-80GB", share_milli=428, mig_profile=profile, mig_start=start)],
            team=team)))
    assert len(backend.mig_layout()[0]) == 2  # both applied
    assert [(s["UUID"], s["allocation"], s["team"]) for s in info_series(registry)] == [
        (uuid, "s1", "research"), (uuid, "s2", "ops")]


async def test_the_start_up_query_labels_the_allocations_a_restarted_agent_finds(node, monkeypatch) -> None:
    node.agent.synced = False
    listed = [{"allocation_id": "r1", "job_id": "job-r1", "team": "research", "project": "llm", "cluster": "local",
               "node": "n0", "gpus": [g.model_dump() for g in whole(node.uuids, 0)]},
              {"allocation_id": "elsewhere", "job_id": "job-x", "team": "x", "project": "x", "cluster": "local",
               "node": "n9", "gpus": [g.model_dump() for g in whole(node.uuids, 1)]}]

    async def snapshot(nc, subscribed_at, scope=None):  # type: ignore[no-untyped-def]
        return listed

    monkeypatch.setattr(handlers, "live_snapshot", snapshot)
    await node.agent.sync_allocations(SimpleNamespace(is_set=lambda: False), 0.0)  # type: ignore[arg-type]
    assert [(s["Hostname"], s["gpu"], s["job_id"], s["allocation"]) for s in info_series(node.registry)] == [
        ("n0", "0", "job-r1", "r1")]


async def test_a_missed_release_goes_at_the_next_listing_and_a_grant_newer_than_the_listing_stays(node,
                                                                                                monkeypatch) -> None:
    """Allocation events reach the agent over core NATS, which may drop them: an allocation placement no longer
    lists (its release missed) loses its series at the next sync; one granted after the listing began keeps them."""
    old, new = granted("old", "n0", whole(node.uuids, 0)), granted("new", "n0", whole(node.uuids, 1))
    await node.agent._on_allocation(Msg(old))
    await asyncio.sleep(0.01)
    listening = handlers.time.monotonic()
    await asyncio.sleep(0.01)
    await node.agent._on_allocation(Msg(new))  # granted after the listing began: it may be missing from it

    async def snapshot(nc, subscribed_at, scope=None):  # type: ignore[no-untyped-def]
        return []  # placement lists neither: "old" was released, its release never arrived

    monkeypatch.setattr(handlers, "live_snapshot", snapshot)
    await node.agent.sync_allocations(SimpleNamespace(is_set=lambda: False), listening)  # type: ignore[arg-type]
    assert [s["allocation"] for s in info_series(node.registry)] == ["new"]
    await node.agent._on_allocation(Msg(old))  # nor does a late grant bring it back
    assert [s["allocation"] for s in info_series(node.registry)] == ["new"]


async def test_nodes_of_one_process_keep_their_own_series_and_no_label_clashes_with_the_scrape_s(clock) -> None:
    """A simulated fleet's nodes share one registry: a node's change leaves the others' series alone. The labels
    are bounded (seven, none of them the `job` or `instance` Prometheus sets on every scraped series)."""
    registry = CollectorRegistry()
    metrics = DcgmMetrics(registry)
    agents = {}
    for name in ("n0", "n1"):
        backend = SimulatedNvml(name, ["L40S"] * 2, seed=3, clock=clock)
        backend.open()
        agents[name] = Agent(backend, name, metrics)
    grants = {name: granted(f"g-{name}", name, [AllocatedGpu(uuid=a.backend.node_info().gpus[1].uuid, index=1,
                                                             model="L40S")]) for name, a in agents.items()}
    for name, agent in agents.items():
        await agent._on_allocation(Msg(grants[name]))
    await agents["n0"]._on_allocation(Msg(released(grants["n0"])))
    series = info_series(registry)
    assert [(s["Hostname"], s["allocation"]) for s in series] == [("n1", "g-n1")]
    assert set(series[0]) == set(ALLOCATION_LABELS) and not {"job", "instance"} & set(ALLOCATION_LABELS)


async def test_the_recording_rule_gives_each_team_the_mean_utilisation_of_its_gpus_from_a_real_scrape(
        node, tmp_path) -> None:
    """The agent's own scrape (DCGM_FI_DEV_GPU_UTIL and the allocation info, as Prometheus would store them with the
    target's job and instance) fed to promtool with deploy/prometheus/rules/gpu_jobs.yml: each team's figure is the
    mean of its GPUs' utilisation read from the same scrape. Utilisation rounded to whole percents so the means
    below (of one or two GPUs) are exact in floating point."""
    u = node.uuids
    grants = [granted("w0", "n0", whole(u, 0), team="research"),
              granted("f1", "n0", [AllocatedGpu(uuid=u[1], index=1, model="H100-80GB", share_milli=500)],
                      team="research"),
              granted("f2", "n0", [AllocatedGpu(uuid=u[1], index=1, model="H100-80GB", share_milli=250)],
                      team="serving", project="chat"),
              granted("w2", "n0", whole(u, 2, 3), team="ops", project="infra")]
    node.agent.workloads = {"training": "training"}
    for grant in grants:
        await node.agent._on_allocation(Msg(grant))
    for _ in range(3):
        node.clock.advance(5)
        await node.agent.sample_once()
    text = generate_latest(node.registry).decode()
    families = {f.name: f.samples for f in text_string_to_metric_families(text)}
    util = {s.labels["UUID"]: round(s.value) for s in families["DCGM_FI_DEV_GPU_UTIL"]}
    assert len(util) == 4 and len(families[ALLOCATION_INFO]) == 5

    def series(name: str, labels: dict[str, str], value: float) -> dict[str, str]:
        body = ", ".join(f'{k}="{v}"' for k, v in {"job": "agent", "instance": "n0:9107", **labels}.items())
        return {"series": f"{name}{{{body}}}", "values": f"{value:g}x5"}

    inputs = [series("DCGM_FI_DEV_GPU_UTIL", s.labels, util[s.labels["UUID"]])
              for s in families["DCGM_FI_DEV_GPU_UTIL"]]
    inputs += [series(ALLOCATION_INFO, s.labels, s.value) for s in families[ALLOCATION_INFO]]
    expected = {"research": (util[u[0]] + util[u[1]]) / 2, "serving": util[u[1]], "ops": (util[u[2]] + util[u[3]]) / 2}
    assert len(set(expected.values())) == 3 and min(util.values()) > 0  # busy GPUs, a figure per team its own
    (tmp_path / "scrape_test.yml").write_text(yaml.safe_dump({
        "rule_files": [str(RULES)], "evaluation_interval": "1m",
        "tests": [{"name": "from the agent's scrape", "interval": "1m", "input_series": inputs,
                   "promql_expr_test": [{"expr": "gpupool:gpu_utilization:avg_by_team", "eval_time": "2m",
                                         "exp_samples": [
                                             {"labels": f'gpupool:gpu_utilization:avg_by_team{{team="{team}"}}',
                                              "value": value} for team, value in sorted(expected.items())]}]}]}))
    done = subprocess.run([debian_tool("promtool"), "test", "rules", str(tmp_path / "scrape_test.yml")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "SUCCESS" in done.stdout, done.stdout + done.stderr
