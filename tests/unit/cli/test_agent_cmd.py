"""`gpupool agent`'s settings from its flags (the inventory benchmark starts simulated fleets with it)."""

from __future__ import annotations

import argparse

from libs.cli import agent_cmd


def test_agent_settings_for_a_simulated_fleet_and_for_a_real_node() -> None:
    args = agent_cmd.build_parser().parse_args(["--simulate", "3", "--gpus-per-node", "4", "--model", "L40S",
                                                "--prefix", "b0-node", "--interval", "0.5", "--nats-url", "nats://x"])
    env = agent_cmd.agent_env(args, base={"PATH": "/bin"})
    assert env["GPUPOOL_AGENT_BACKEND"] == "sim" and env["GPUPOOL_AGENT_SIM_FLEET"] == "L40S*4;L40S*4;L40S*4"
    assert (env["GPUPOOL_AGENT_SIM_NODE_PREFIX"], env["GPUPOOL_AGENT_INTERVAL_S"]) == ("b0-node", "0.5")
    assert env["GPUPOOL_AGENT_NATS_URL"] == "nats://x" and env["PATH"] == "/bin"
    real = agent_cmd.agent_env(argparse.Namespace(simulate=0, cluster="east", interval=1.0, log_level="INFO",
                                                  http_port=0, nats_url=None, node="gpu-17"), base={})
    assert real["GPUPOOL_AGENT_BACKEND"] == "real" and real["GPUPOOL_AGENT_NODE"] == "gpu-17"
    assert "GPUPOOL_AGENT_SIM_FLEET" not in real
    assert "GPUPOOL_AGENT_HEARTBEAT_S" not in env and "GPUPOOL_AGENT_SIM_BACKGROUND" not in env  # agent defaults
    loaded = agent_cmd.agent_env(agent_cmd.build_parser().parse_args(
        ["--simulate", "2", "--heartbeat", "0", "--background", "training=0.5,dev=0.2"]), base={})
    assert (loaded["GPUPOOL_AGENT_HEARTBEAT_S"], loaded["GPUPOOL_AGENT_SIM_BACKGROUND"]) == ("0.0", "training=0.5,dev=0.2")
