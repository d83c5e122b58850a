"""A service's routing table: which commands it answers and which events it consumes, in one place.

Each service's handlers.py ends with a `routes(...)` function returning one of these, so a reader sees at a glance
everything that can make the service act.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from libs.bus.consumer import Poison
from libs.contracts.commands import Command
from libs.contracts.envelope import CloudEvent
from libs.contracts.events import EventData, TelemetrySampled

EventHandler = Callable[[CloudEvent, Any], Awaitable[None]]
BatchHandler = Callable[[list[tuple[CloudEvent, Any]]], Awaitable[None]]


@dataclass
class Routes:
    commands: dict[str, tuple[type[Command], Callable[[Any], Awaitable[Any]]]] = field(default_factory=dict)
    # for a command on a wildcard subject: the check that its subject's tokens name what the command names
    subject_checks: dict[str, Callable[[str, Any], str | None]] = field(default_factory=dict)
    events: dict[type[EventData], EventHandler] = field(default_factory=dict)
    telemetry: EventHandler | None = None
    # optional: a whole fetched batch of telemetry in one call (idempotent, high-volume consumers); `telemetry`
    # still handles one message at a time when a batch fails, so poison is isolated
    telemetry_batch: BatchHandler | None = None
    # opt-in: the event (and per-message telemetry) consumers apply each fetched batch in one transaction, a
    # savepoint per message (libs.bus.consumer); the service's README says why its handlers allow it
    batched: bool = False

    def event_subjects(self) -> tuple[str, ...]:
        return tuple(sorted({cls.filter_subject() for cls in self.events}))

    async def dispatch(self, event: CloudEvent, data: EventData) -> None:
        handler = self.events.get(type(data))
        if handler is None:
            raise Poison("UnsupportedEventType", f"no handler for {event.type}")
        await handler(event, data)

    async def dispatch_telemetry_batch(self, batch: list[tuple[CloudEvent, EventData]]) -> None:
        if self.telemetry_batch is None or not all(isinstance(d, TelemetrySampled) for _, d in batch):
            raise Poison("UnsupportedEventType", "a message in the batch is not a telemetry sample")
        await self.telemetry_batch(batch)

    async def dispatch_telemetry(self, event: CloudEvent, data: EventData) -> None:
        if not isinstance(data, TelemetrySampled) or self.telemetry is None:
            raise Poison("UnsupportedEventType", f"{event.type} is not a telemetry sample")
        await self.telemetry(event, data)
