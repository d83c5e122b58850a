"""A service's routing table: which commands it answers and which events it consumes, in one place.

Each service's handlers.py ends with a `routes(...)` function returning one of these, so a reader sees at a glance
everything that can make the service act.

Every event route says how a redelivered event is kept from applying twice, and nothing else does:
- `once(handler)`: the dispatch records (inbox consumer, event id) in the inbox with the handler's first unit of
  work, in the same transaction as its state change and outbox rows, and skips (acks) an event the inbox already
  holds (libs.store.unit_of_work.apply_once). The handler itself never looks at the inbox.
- `idempotent(handler, why)`: no inbox; applying the event again changes nothing by design (latest-wins or
  revision-guarded upserts, keys that make a replay a no-op), and `why` says which.
A bare handler is refused, so no route can forget to say.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from libs.bus.consumer import Poison
from libs.contracts.commands import Command
from libs.contracts.envelope import CloudEvent
from libs.contracts.events import EventData, TelemetrySampled
from libs.store.unit_of_work import apply_once

EventHandler = Callable[[CloudEvent, Any], Awaitable[None]]
BatchHandler = Callable[[list[tuple[CloudEvent, Any]]], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class EventRoute:
    """A handler and how it is kept from applying an event twice (use `once` or `idempotent`)."""
    handler: EventHandler
    applied_once: bool  # True: through the inbox; False: idempotent by design (`why` says how)
    why: str = ""


def once(handler: EventHandler) -> EventRoute:
    """Applied at most once per event: the inbox check is done for the handler (see the module docstring)."""
    return EventRoute(handler, applied_once=True)


def idempotent(handler: EventHandler, why: str) -> EventRoute:
    """No inbox: applying the event again changes nothing, for the reason `why` gives."""
    if not why.strip():
        raise ValueError("an idempotent route says why applying an event twice changes nothing")
    return EventRoute(handler, applied_once=False, why=why)


@dataclass
class Routes:
    commands: dict[str, tuple[type[Command], Callable[[Any], Awaitable[Any]]]] = field(default_factory=dict)
    # for a command on a wildcard subject: the check that its subject's tokens name what the command names
    subject_checks: dict[str, Callable[[str, Any], str | None]] = field(default_factory=dict)
    events: dict[type[EventData], EventRoute] = field(default_factory=dict)
    telemetry: EventRoute | None = None
    # optional: a whole fetched batch of telemetry in one call (idempotent, high-volume consumers); `telemetry`
    # still handles one message at a time when a batch fails, so poison is isolated
    telemetry_batch: BatchHandler | None = None
    # opt-in: the event (and per-message telemetry) consumers apply each fetched batch in one transaction, a
    # savepoint per message (libs.bus.consumer); the service's README says why its handlers allow it
    batched: bool = False
    # the inbox's consumer name: applied-once events are recorded under (inbox, event id); the service's name
    inbox: str = ""

    def __post_init__(self) -> None:
        routes = [*self.events.values(), *([self.telemetry] if self.telemetry is not None else [])]
        for route in routes:
            if not isinstance(route, EventRoute):
                raise TypeError(f"event route {route!r} does not say how it applies an event once: "
                                "wrap it in once(...) or idempotent(..., why)")
        if any(r.applied_once for r in routes) and not self.inbox:
            raise ValueError("routes applied once need the inbox's consumer name (Routes(inbox=...))")
        if self.telemetry_batch is not None and (self.telemetry is None or self.telemetry.applied_once):
            raise ValueError("a telemetry batch handler applies no inbox: its per-message route must be idempotent")

    def event_subjects(self) -> tuple[str, ...]:
        return tuple(sorted({cls.filter_subject() for cls in self.events}))

    async def dispatch(self, event: CloudEvent, data: EventData) -> None:
        route = self.events.get(type(data))
        if route is None:
            raise Poison("UnsupportedEventType", f"no handler for {event.type}")
        await self._apply(route, event, data)

    async def _apply(self, route: EventRoute, event: CloudEvent, data: EventData) -> None:
        if route.applied_once:
            await apply_once(self.inbox, event.id, lambda: route.handler(event, data))
        else:
            await route.handler(event, data)

    async def dispatch_telemetry_batch(self, batch: list[tuple[CloudEvent, EventData]]) -> None:
        if self.telemetry_batch is None or not all(isinstance(d, TelemetrySampled) for _, d in batch):
            raise Poison("UnsupportedEventType", "a message in the batch is not a telemetry sample")
        await self.telemetry_batch(batch)

    async def dispatch_telemetry(self, event: CloudEvent, data: EventData) -> None:
        if not isinstance(data, TelemetrySampled) or self.telemetry is None:
            raise Poison("UnsupportedEventType", f"{event.type} is not a telemetry sample")
        await self._apply(self.telemetry, event, data)
