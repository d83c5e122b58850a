"""The base of every event payload (EventData: its type, subject, entity and the bounds every event keeps), apart
from the payloads themselves (libs/contracts/events.py, agent_events.py) so that both can build on it."""

from __future__ import annotations

from datetime import datetime
from typing import ClassVar, Literal

from pydantic import BaseModel, ConfigDict, model_validator

from libs.contracts.envelope import CloudEvent, schema_of, utcnow, uuid7

Health = Literal["healthy", "degraded", "failed"]


# Events are input too (libs/contracts/origins.py): beside each model's own bounds, no number in any event may be
# beyond what the platform ever counts (a GPU total, a revision, bytes, seconds), nor any float non-finite, nor any
# text longer than a log line's chunk. A forged 1e308 would otherwise reach arithmetic that overflows.
MAX_EVENT_NUMBER = 2**53  # exact in a float and in JavaScript
MAX_EVENT_TEXT = 1 << 20


def _out_of_bounds(value: object, depth: int = 0) -> str | None:
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int | float):
        if value != value or abs(value) > MAX_EVENT_NUMBER:  # NaN, ±inf, or too large
            return f"number {value!r} is beyond ±{MAX_EVENT_NUMBER}"
        return None
    if isinstance(value, str):
        return f"text of {len(value)} characters (at most {MAX_EVENT_TEXT})" if len(value) > MAX_EVENT_TEXT else None
    if depth > 8:
        return None  # the models nest a few levels; their own fields are checked where they are models
    if isinstance(value, dict):
        items = list(value.values())
    elif isinstance(value, list | tuple):
        items = list(value)
    elif isinstance(value, BaseModel):
        items = [getattr(value, name) for name in type(value).model_fields]
    else:
        return None
    for item in items:
        why = _out_of_bounds(item, depth + 1)
        if why:
            return why
    return None


class EventData(BaseModel):
    """Base of every event payload: knows its CloudEvents type, its subject and which field names the entity."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    event_type: ClassVar[str]
    event_subject: ClassVar[str]
    entity_field: ClassVar[str]
    # False for a high-volume type whose every field carries its own bounds instead (walking costs its consumers
    # more than validating the payload: ~0.13 ms per 8-GPU telemetry sample)
    walk_bounds: ClassVar[bool] = True
    # True for what a node's agent publishes: its subject ends with `.<cluster>.<node>` (the event's own), so the
    # server lets each node's identity publish only its own (deploy/nats/permissions.yaml)
    node_scoped: ClassVar[bool] = False

    @classmethod
    def filter_subject(cls) -> str:
        """What a consumer of this type filters on: the subject, or every node's for a node-scoped type."""
        return f"{cls.event_subject}.*.*" if cls.node_scoped else cls.event_subject

    @model_validator(mode="after")
    def _bounded(self) -> EventData:
        if not self.walk_bounds:
            return self
        for name in type(self).model_fields:
            why = _out_of_bounds(getattr(self, name))
            if why:
                raise ValueError(f"{name}: {why}")
        return self

    def entity_id(self) -> str:
        return str(getattr(self, self.entity_field))

    def to_cloudevent(self, source: str, *, event_id: str | None = None, traceparent: str | None = None,
                      time: datetime | None = None) -> CloudEvent:
        return CloudEvent(
            id=event_id or uuid7(),
            source=source,
            type=self.event_type,
            subject=self.entity_id(),
            time=time or utcnow(),
            dataschema=schema_of(self.event_type),
            data=self.model_dump(mode="json"),
            traceparent=traceparent,
        )


class AllocationSubject(EventData):
    """Whose allocation an event concerns and where it lives: what every allocation event (placement's) and every
    agent event about an allocation say."""

    entity_field: ClassVar[str] = "allocation_id"

    allocation_id: str
    job_id: str
    team: str
    project: str
    cluster: str
    node: str
