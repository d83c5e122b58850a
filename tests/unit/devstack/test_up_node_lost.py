"""`gpupool up --telemetry-interval S` keeps inventory's node-lost timeout above the agent's sampling gap: at a 10 s
interval the 15 s default declared most of a busy 1,024-node simulated fleet lost between two samples (952 of
1,024 nodes unschedulable in the backlog benchmark)."""

from __future__ import annotations

from pathlib import Path

from libs.devstack import stack as devstack
from tests.unit.devstack.stacks import processes


def test_the_node_lost_timeout_covers_three_sampling_gaps_and_never_drops_under_the_default() -> None:
    assert devstack.node_lost_after_s(1.0) == 15.0  # heartbeat 5 s: 3 x 5
    assert devstack.node_lost_after_s(2.0) == 18.0  # sent at the third sample after the heartbeat: 6 s gaps
    assert devstack.node_lost_after_s(10.0) == 30.0
    assert devstack.node_lost_after_s(0.5) == 15.0


def test_up_hands_inventory_the_timeout_for_its_agents_interval(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    with processes(tmp_path, monkeypatch, agent_interval_s=10.0) as procs:
        assert procs["inventory"].env["GPUPOOL_INVENTORY_NODE_LOST_AFTER_S"] == "30"


def test_a_timeout_given_for_inventory_wins(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    with processes(tmp_path, monkeypatch, agent_interval_s=10.0,
                   service_env={"inventory": {"NODE_LOST_AFTER_S": "120"}}) as procs:
        assert procs["inventory"].env["GPUPOOL_INVENTORY_NODE_LOST_AFTER_S"] == "120"


def test_the_heartbeat_up_assumes_is_the_agents_default() -> None:
    from services.agent.config import AgentSettings

    assert AgentSettings.model_fields["heartbeat_s"].default == devstack.AGENT_HEARTBEAT_S
