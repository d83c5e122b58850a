"""Who may send which event: every event type has one owning service, and an event is taken only from it.

Events are input too. NATS permissions decide who may publish on a subject (deploy/nats/permissions.yaml); on
receipt a consumer checks the rest of the claim, before any handler sees the event (`accept`):

- its `type` is a known gpupool event and it arrived on exactly the subject its publisher sends it on
  (`subject_for`): a `quota.set` cannot ride on another subject into a stream whose consumers read every subject,
  and a node's telemetry names the node whose subject it came on;
- its `source` is the type's owner (`/gpupool/<service>`; the agent may add `/<cluster>/<node>`);
- its content holds no NUL character (PostgreSQL's text refuses it: retrying never helps) and its payload is
  within the bounds of the event model (checked by `decode_data`).

Anything else is invalid input: dead-lettered at once, counted, never retried."""

from __future__ import annotations

from libs.contracts.envelope import CloudEvent, InvalidEnvelope, parse_envelope
from libs.contracts.events import EVENT_TYPES, EventData, decode_data, subject_for

# the entity part of `io.gpupool.<entity>.<event>.vN` → the service that owns (and alone publishes) it
OWNERS: dict[str, str] = {
    "node": "inventory", "gpu": "inventory", "job": "queue", "allocation": "placement", "decision": "placement",
    "quota": "quota", "reclaim": "reclamation", "usage": "accounting", "agent": "agent", "endpoint": "agent",
}
# types whose entity is shared by two owners
TYPE_OWNERS: dict[str, str] = {
    "io.gpupool.telemetry.sampled.v1": "agent",
    "io.gpupool.telemetry.rolled_up.v1": "inventory",
}
SOURCE_PREFIX = "/gpupool/"


def owner_of(event_type: str) -> str | None:
    """The service that publishes this type; None for a type gpupool does not know."""
    if event_type in TYPE_OWNERS:
        return TYPE_OWNERS[event_type]
    parts = event_type.split(".")
    if len(parts) < 4 or parts[0] != "io" or parts[1] != "gpupool" or event_type not in EVENT_TYPES:
        return None
    return OWNERS.get(parts[2])


def source_allowed(event_type: str, source: str) -> bool:
    owner = owner_of(event_type)
    if owner is None:
        return False
    own = SOURCE_PREFIX + owner
    return source == own or (owner == "agent" and source.startswith(own + "/"))


def _has_nul(value: object) -> bool:
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, str):
            if "\x00" in v:
                return True
        elif isinstance(v, dict):
            stack.extend(v.keys())
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)
    return False


def check_source(event: CloudEvent) -> None:
    """InvalidEnvelope unless the event's source is its type's owner."""
    if event.type not in EVENT_TYPES:
        raise InvalidEnvelope(f"unknown event type {event.type!r}")
    if not source_allowed(event.type, event.source):
        raise InvalidEnvelope(f"{event.type} from {event.source!r}: only {SOURCE_PREFIX}{owner_of(event.type)} "
                              "publishes it")


def vet(raw: bytes, event: CloudEvent, data: EventData, subject: str | None) -> None:
    """The checks beyond the payload's model, on an event already decoded from `raw`; InvalidEnvelope. `subject`
    None: not checked (a reader of one subject it chose itself)."""
    if b"\\u0000" in raw and (_has_nul(event.data if isinstance(event.data, dict) else data.model_dump())
                               or _has_nul([event.id, event.source, event.subject or ""])):
        raise InvalidEnvelope("the event contains a NUL character")
    check_source(event)
    if subject is not None and subject != subject_for(data):
        raise InvalidEnvelope(f"{event.type} about {data.entity_id()!r} arrived on {subject!r}, not on "
                              f"{subject_for(data)!r}")


def accept(raw: bytes, subject: str | None) -> tuple[CloudEvent, EventData]:
    """Parse, decode and vet one message of a stream. InvalidEnvelope for anything not to be taken."""
    event = parse_envelope(raw)
    data = decode_data(event)
    vet(raw, event, data, subject)
    return event, data
