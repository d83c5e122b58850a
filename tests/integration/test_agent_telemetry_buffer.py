"""The agent against a real NATS server whose JetStream cannot take telemetry (the stream is gone, as while a
JetStream cluster has no leader): samples wait in the agent's bounded buffer and reach the stream, in the order
they were taken, once it is back."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from nats.js import JetStreamContext

from libs.bus.connection import connect, ensure_streams
from libs.contracts.subjects import TELEMETRY_STREAM
from services.agent.handlers import NodeAgent
from services.agent.nvml_sim import SimulatedNvml

pytestmark = [pytest.mark.integration]


async def test_samples_taken_while_jetstream_cannot_store_them_arrive_in_order_once_it_can(
        nats_url: str, js: JetStreamContext) -> None:
    nc = await connect(nats_url, "agent-buffer-test")
    try:
        sim = SimulatedNvml("n-buffer", ["H100-80GB"] * 2, seed=1, clock=time.time)
        sim.open()
        agent = NodeAgent(nc, sim, "c1", "n-buffer", 1.0)
        agent.buffer.retry_s = agent.buffer.retry_max_s = 0.05
        stop = asyncio.Event()
        flusher = asyncio.create_task(agent.buffer.flush_forever(stop))

        for _ in range(5):  # no GPUPOOL_TELEMETRY stream: JetStream does not answer these
            await agent.sample_once()
        assert agent.samples_sent == 0 and len(agent.buffer) == 5

        await ensure_streams(js, (TELEMETRY_STREAM,))
        await agent.sample_once()  # behind the backlog
        deadline = time.monotonic() + 20
        while len(agent.buffer):
            assert time.monotonic() < deadline, f"{len(agent.buffer)} samples still buffered"
            await asyncio.sleep(0.05)
        stop.set()
        await flusher

        state = (await js.stream_info(TELEMETRY_STREAM.name)).state
        assert state.messages == 6
        taken = [json.loads((await js.get_msg(TELEMETRY_STREAM.name, seq)).data)["data"]["sampled_at"]
                 for seq in range(state.first_seq, state.last_seq + 1)]
        assert taken == sorted(taken) and len(set(taken)) == 6
        assert agent.buffer.dropped == 0
    finally:
        await nc.close()
