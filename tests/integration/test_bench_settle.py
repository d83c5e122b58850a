"""The backlog benchmark waits for the bus consumers to take in the fill before it measures: against real JetStream."""

from __future__ import annotations

import contextlib
import time

import pytest
from nats.js.api import ConsumerConfig, StreamConfig

from libs.bench.backlog import settle
from libs.bus.connection import connect

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]


async def test_settle_waits_for_pending_and_unacknowledged_messages_and_reports_what_a_deadline_left(
        nats_url: str, clean_jetstream: None) -> None:
    nc = await connect(nats_url, "bench-settle-test")
    try:
        js = nc.jetstream()
        await js.add_stream(StreamConfig(name="SETTLE_TEST", subjects=["settle.test.>"]))
        for i in range(3):
            await js.publish(f"settle.test.{i}", b"x")
        sub = await js.pull_subscribe("settle.test.>", durable="slow", config=ConsumerConfig(ack_wait=30))
        waited, pending = await settle(nc, deadline=time.monotonic() + 1.5)
        assert pending == 3 and waited >= 1.5  # nobody consumed: the deadline cut the wait short
        msgs = await sub.fetch(3, timeout=5)
        waited, pending = await settle(nc, deadline=time.monotonic() + 1.5)
        assert pending == 3  # fetched, not acknowledged: still not taken in
        for m in msgs:
            await m.ack()
        waited, pending = await settle(nc, deadline=time.monotonic() + 10)
        assert pending == 0 and waited < 5
    finally:
        with contextlib.suppress(Exception):
            await nc.jetstream().delete_stream("SETTLE_TEST")
        await nc.close()
