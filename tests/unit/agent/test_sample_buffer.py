"""Telemetry through a bus outage: kept in order, bounded by bytes (oldest dropped and counted), flushed oldest
first once the bus answers, and nothing is buffered while the bus takes every sample."""

from __future__ import annotations

import asyncio

from services.agent.sample_buffer import SampleBuffer


class Bus:
    def __init__(self) -> None:
        self.up = True
        self.stored: list[bytes] = []

    async def publish(self, subject: str, payload: bytes, headers: dict[str, str]) -> object:
        if not self.up:
            raise ConnectionError("nats: no servers available")
        self.stored.append(payload)
        return object()

    async def publish_batch(self, messages: list[tuple[str, bytes, dict[str, str]]]) -> list[object]:
        out: list[object] = []
        for subject, payload, headers in messages:
            try:
                out.append(await self.publish(subject, payload, headers))
            except ConnectionError as exc:
                out.append(exc)
        return out


async def drained(buffer: SampleBuffer) -> None:
    """Until the flusher emptied the buffer (at most 2 s; the assertions after it say what arrived)."""
    for _ in range(200):
        if not len(buffer):
            return
        await asyncio.sleep(0.01)


def sample(n: int) -> bytes:
    return f"sample-{n:04d}".encode().ljust(100, b".")


async def test_samples_taken_during_an_outage_arrive_in_order_after_it() -> None:
    bus = Bus()
    buffer = SampleBuffer(bus.publish, bus.publish_batch, retry_s=0.01, retry_max_s=0.02)
    stop = asyncio.Event()
    flusher = asyncio.create_task(buffer.flush_forever(stop))
    assert await buffer.send("t", sample(0), {})
    bus.up = False
    for n in range(1, 6):
        assert not await buffer.send("t", sample(n), {})
    await asyncio.sleep(0.05)  # the flusher retries while the bus is away
    assert len(buffer) == 5 and bus.stored == [sample(0)]
    bus.up = True
    assert not await buffer.send("t", sample(6), {})  # behind the backlog, not ahead of it
    await drained(buffer)
    assert bus.stored == [sample(n) for n in range(7)]
    assert buffer.bytes == 0 and buffer.dropped == 0
    assert await buffer.send("t", sample(7), {})  # drained: straight through again
    stop.set()
    await flusher


async def test_a_long_outage_keeps_the_newest_samples_within_the_byte_budget() -> None:
    bus = Bus()
    bus.up = False
    buffer = SampleBuffer(bus.publish, bus.publish_batch, max_bytes=1_000)  # room for ten 100-byte samples
    for n in range(25):
        await buffer.send("t", sample(n), {})
    assert len(buffer) == 10 and buffer.bytes == 1_000
    assert buffer.dropped == 15
    bus.up = True
    stop = asyncio.Event()
    flusher = asyncio.create_task(buffer.flush_forever(stop))
    await drained(buffer)
    stop.set()
    await flusher
    assert bus.stored == [sample(n) for n in range(15, 25)]  # the newest, oldest first


async def test_after_a_failure_the_oldest_sample_goes_alone_and_a_partly_stored_chunk_is_retried_in_order() -> None:
    bus = Bus()
    sizes: list[int] = []

    async def recording_batch(messages):  # type: ignore[no-untyped-def]
        sizes.append(len(messages))
        if sizes.count(7) == 1 and len(messages) == 7:  # the chunk after the probe: three stored, bus gone
            return [*(await bus.publish_batch(messages[:3])), *[ConnectionError("gone")] * (len(messages) - 3)]
        return await bus.publish_batch(messages)

    bus.up = False
    buffer = SampleBuffer(bus.publish, recording_batch, retry_s=0.01)
    for n in range(8):
        await buffer.send("t", sample(n), {})
    stop = asyncio.Event()
    flusher = asyncio.create_task(buffer.flush_forever(stop))
    await asyncio.sleep(0.05)  # attempts while the bus is away: one sample each
    assert sizes and set(sizes) == {1}
    bus.up = True
    await drained(buffer)
    stop.set()
    await flusher
    # the probe (alone), a chunk cut short after three, the next probe (alone), then the rest as one chunk
    assert sizes[-4:] == [1, 7, 1, 3]
    assert bus.stored == [sample(n) for n in range(8)]  # each once, in the order taken
