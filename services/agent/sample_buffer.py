"""Telemetry that could not be published waits here, in order, within a fixed memory budget.

A bus outage (NATS restarting, a network partition, JetStream without a leader) must not lose the samples taken
meanwhile — inventory's rollups and reclamation's idle detection are built from them — nor grow the agent's memory
without bound. One buffer per agent process (a simulated fleet shares it): a sample that failed to publish, and
every sample after it while anything is waiting (so order is kept), is appended; past `max_bytes` the oldest are
dropped and counted. One flusher publishes the backlog oldest first once the bus answers again; each message keeps
its event id as `Nats-Msg-Id`, so a sample JetStream stored although its ack was lost is not stored twice. The
backlog goes out in pipelined chunks (a fleet's backlog drains faster than it grew).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from prometheus_client import Counter, Gauge

log = logging.getLogger(__name__)

BUFFERED = Gauge("gpupool_agent_samples_buffered", "Telemetry messages waiting for the bus")
BUFFERED_BYTES = Gauge("gpupool_agent_samples_buffered_bytes", "Bytes of telemetry waiting for the bus")
DROPPED = Counter("gpupool_agent_samples_dropped_total",
                  "Telemetry messages dropped, oldest first, because the buffer was full during a bus outage")
FLUSHED = Counter("gpupool_agent_samples_flushed_total", "Buffered telemetry messages published after an outage")

Publish = Callable[[str, bytes, dict[str, str]], Awaitable[object]]
# (subject, payload, headers) in order → per message its ack or the exception (libs.bus.publisher.publish_raw_batch)
PublishBatch = Callable[[list[tuple[str, bytes, dict[str, str]]]], Awaitable[list[object]]]
FLUSH_CHUNK = 64


@dataclass(frozen=True, slots=True)
class Pending:
    subject: str
    payload: bytes
    headers: dict[str, str]


class SampleBuffer:
    def __init__(self, publish: Publish, publish_batch: PublishBatch, *, max_bytes: int = 32 * 1024 * 1024,
                 retry_s: float = 0.5, retry_max_s: float = 5.0) -> None:
        self.publish = publish
        self.publish_batch = publish_batch
        self.max_bytes = max_bytes
        self.retry_s = retry_s
        self.retry_max_s = retry_max_s
        self._queue: deque[Pending] = deque()
        self._bytes = 0
        self.dropped = 0
        self._wake = asyncio.Event()

    def __len__(self) -> int:
        return len(self._queue)

    @property
    def bytes(self) -> int:
        return self._bytes

    async def send(self, subject: str, payload: bytes, headers: dict[str, str]) -> bool:
        """Publish now when nothing is waiting; else (or if that fails) keep it for the flusher. True: published."""
        if not self._queue:
            try:
                await self.publish(subject, payload, headers)
                return True
            except Exception as exc:  # the bus is away: keep it, and everything after it, in order
                log.warning("telemetry_publish_failed_buffering", extra={"subject": subject, "error": repr(exc)})
        self._append(Pending(subject, payload, headers))
        return False

    def _append(self, item: Pending) -> None:
        self._queue.append(item)
        self._bytes += len(item.payload)
        while self._bytes > self.max_bytes and len(self._queue) > 1:
            old = self._queue.popleft()
            self._bytes -= len(old.payload)
            self.dropped += 1
            DROPPED.inc()
        self._observe()
        self._wake.set()

    def _observe(self) -> None:
        BUFFERED.set(len(self._queue))
        BUFFERED_BYTES.set(self._bytes)

    async def flush_forever(self, stop: asyncio.Event) -> None:
        """Publish the backlog oldest first whenever there is one, retrying with back-off while the bus is away."""
        delay = self.retry_s
        # After a failure the oldest sample goes alone: were it pipelined with the ones after it, those could be
        # stored while it is refused, i.e. out of order. Once the bus takes it, the rest goes in chunks (a failure
        # in the middle of a chunk can still store later samples first; inventory ignores a sample older than a
        # GPU's latest).
        size = 1
        while not stop.is_set():
            if not self._queue:
                size = 1  # the next backlog starts after a failure too
                self._wake.clear()
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), timeout=1.0)
                continue
            chunk = [self._queue[i] for i in range(min(size, len(self._queue)))]
            try:
                results = await self.publish_batch([(p.subject, p.payload, p.headers) for p in chunk])
            except Exception as exc:
                results = [exc]
            stored = 0
            for result in results:  # the stored prefix leaves the queue; the rest is retried, in order
                if isinstance(result, BaseException):
                    break
                stored += 1
            for item in chunk[:stored]:
                if self._queue and self._queue[0] is item:  # not dropped for room meanwhile
                    self._queue.popleft()
                    self._bytes -= len(item.payload)
            FLUSHED.inc(stored)
            self._observe()
            if stored < len(chunk):
                log.info("telemetry_flush_retry", extra={"waiting": len(self._queue), "retry_in_s": delay,
                                                         "error": repr(results[stored]) if stored < len(results)
                                                         else "incomplete"})
                await asyncio.sleep(delay)
                delay = min(self.retry_max_s, delay * 2)
                size = 1
            else:
                delay = self.retry_s
                size = FLUSH_CHUNK
