"""What the checker read, as plain data: each service's store (one read-only repeatable-read snapshot per
database) and the streams (read after every store, so whatever a store had published is already there).

The invariants (libs/check/invariants.py) are pure functions of this, so they can be tested without I/O."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any


@dataclass(frozen=True)
class OutboxRow:
    seq: int
    event_id: str
    subject: str
    created_at: datetime
    published_at: datetime | None
    attempts: int = 0
    last_error: str | None = None
    data: dict[str, Any] | None = None  # the event's `data`, for the subjects the invariants read

    @property
    def published(self) -> bool:
        return self.published_at is not None


@dataclass
class ServiceStore:
    """One service's database as one snapshot saw it. `tables` holds only what the invariants read."""

    service: str
    now: datetime  # the database's now() inside the snapshot
    outbox: list[OutboxRow] = field(default_factory=list)
    inbox: dict[str, set[str]] = field(default_factory=dict)  # consumer → event ids it has applied
    tables: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    # retention (libs/store/retention.py): outbox / inbox rows older than these may have been pruned (None: never)
    outbox_pruned_before: datetime | None = None
    inbox_pruned_before: datetime | None = None

    def rows(self, table: str) -> list[dict[str, Any]]:
        return self.tables.get(table, [])


@dataclass(frozen=True)
class StreamEvent:
    """A message of GPUPOOL_EVENTS read in full (only the subjects the invariants fold)."""

    seq: int
    subject: str
    event_id: str | None  # the envelope's id (None: not a CloudEvent)
    source: str | None
    type: str | None
    data: dict[str, Any] | None
    time: datetime | None = None  # the envelope's time (when the service emitted it)


@dataclass(frozen=True)
class DeadLetter:
    seq: int
    consumer: str
    reason: str
    error: str
    subject: str  # where the original was published
    stream: str
    stream_seq: int
    event_id: str | None  # the original's envelope id, if it parsed
    source: str | None
    type: str | None


@dataclass(frozen=True)
class ConsumerState:
    stream: str
    name: str
    filter_subjects: tuple[str, ...]
    num_pending: int  # not yet delivered
    num_ack_pending: int  # delivered, not yet acknowledged
    num_redelivered: int
    oldest_seq: int | None  # the first message it has not acknowledged (matching its filters)
    oldest_subject: str | None
    oldest_time: datetime | None
    delivered_seq: int = 0  # the last stream sequence delivered to it (beyond: not yet delivered to anyone)
    num_waiting: int = 0  # pull requests waiting now (0 with messages pending: nobody is pulling)


@dataclass
class StreamView:
    read_at: datetime
    ids: dict[str, dict[str, int]] = field(default_factory=dict)  # stream → Nats-Msg-Id → stream sequence
    max_age_s: dict[str, float] = field(default_factory=dict)  # stream → its retention
    events: list[StreamEvent] = field(default_factory=list)
    dead_letters: list[DeadLetter] = field(default_factory=list)
    consumers: list[ConsumerState] = field(default_factory=list)

    def has(self, stream: str, event_id: str) -> bool:
        return event_id in self.ids.get(stream, {})


@dataclass
class Snapshot:
    stores: dict[str, ServiceStore]
    streams: StreamView | None
    # placement's /metrics as its leader reported them (team, model) → GPUs; None when no metrics were read
    reported_quota_use: dict[tuple[str, str], float] | None = None
    reported_at: datetime | None = None
    reported_by: str | None = None


def event_data(payload: bytes | str | None) -> dict[str, Any] | None:
    """The `data` of a CloudEvent JSON document, or None when it is not one."""
    if payload is None:
        return None
    try:
        doc = json.loads(payload)
    except (ValueError, UnicodeDecodeError):
        return None
    data = doc.get("data") if isinstance(doc, dict) else None
    return data if isinstance(data, dict) else None
