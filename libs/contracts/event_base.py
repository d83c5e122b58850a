"""The base of every event payload (EventData: its type, subject, entity, and the bounds every event keeps, from
libs/contracts/bounds.py), apart from the payloads themselves (libs/contracts/events.py, agent_events.py) so that
both can build on it."""

from __future__ import annotations

from datetime import datetime
from typing import ClassVar, Literal

from pydantic import ConfigDict

from libs.contracts.bounds import MAX_EVENT_NUMBER, MAX_EVENT_TEXT, BoundedModel  # noqa: F401 (the bounds)
from libs.contracts.envelope import CloudEvent, schema_of, utcnow, uuid7

Health = Literal["healthy", "degraded", "failed"]


class EventData(BoundedModel):
    """Base of every event payload: knows its CloudEvents type, its subject and which field names the entity."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    event_type: ClassVar[str]
    event_subject: ClassVar[str]
    entity_field: ClassVar[str]
    # True for what a node's agent publishes: its subject ends with `.<cluster>.<node>` (the event's own), so the
    # server lets each node's identity publish only its own (deploy/nats/permissions.yaml)
    node_scoped: ClassVar[bool] = False

    @classmethod
    def filter_subject(cls) -> str:
        """What a consumer of this type filters on: the subject, or every node's for a node-scoped type."""
        return f"{cls.event_subject}.*.*" if cls.node_scoped else cls.event_subject

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
