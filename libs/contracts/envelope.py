"""The CloudEvents 1.0 envelope (structured JSON mode) every gpupool event travels in.

The event id is a UUIDv7 minted when the outbox row is written and reused on every retry; it doubles as the
`Nats-Msg-Id`, so JetStream's duplicate window and each consumer's inbox can recognise a re-sent event.
"""

from __future__ import annotations

import os
import time
import uuid
from datetime import UTC, datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError


def uuid7(unix_ms: int | None = None) -> str:
    """RFC 9562 UUIDv7: 48-bit Unix milliseconds then random bits, so ids sort by creation time."""
    ms = int(time.time() * 1000) if unix_ms is None else unix_ms
    rand = int.from_bytes(os.urandom(10), "big")
    value = (ms & ((1 << 48) - 1)) << 80
    value |= 0x7 << 76  # version
    value |= ((rand >> 68) & 0xFFF) << 64  # rand_a (12 bits)
    value |= 0b10 << 62  # variant
    value |= rand & ((1 << 62) - 1)  # rand_b (62 bits)
    return str(uuid.UUID(int=value))


SCHEMA_BASE = "https://gpupool.dev/schemas/"  # + "<event type>.json": each event type's JSON Schema `$id`


def schema_of(event_type: str) -> str:
    """The `dataschema` of an event type: its JSON Schema's `$id` (docs/schemas/<event type>.json)."""
    return f"{SCHEMA_BASE}{event_type}.json"


class CloudEvent(BaseModel):
    """A CloudEvents 1.0 structured-mode document. Extension attributes (e.g. `traceparent`) are allowed."""

    model_config = ConfigDict(extra="allow", frozen=True)

    specversion: Literal["1.0"] = "1.0"
    id: str = Field(min_length=1)
    source: str = Field(min_length=1, description="URI-reference of the producer, e.g. /gpupool/placement")
    type: str = Field(min_length=1, description="io.gpupool.<entity>.<event>.v<N>")
    subject: str | None = Field(default=None, description="The entity id the event is about")
    time: datetime
    datacontenttype: Literal["application/json"] = "application/json"
    dataschema: str | None = None
    data: dict[str, Any]
    traceparent: str | None = None

    def to_json(self) -> bytes:
        return self.model_dump_json(exclude_none=True).encode()


class InvalidEnvelope(ValueError):
    """Raised for bytes that are not a valid gpupool CloudEvent: such a message is poison, never retried."""


def parse_envelope(raw: bytes) -> CloudEvent:
    try:
        return CloudEvent.model_validate_json(raw)
    except ValidationError as exc:
        raise InvalidEnvelope(f"not a CloudEvents 1.0 JSON document: {exc.error_count()} error(s): "
                              f"{_first_error(exc)}") from exc


def _first_error(exc: ValidationError) -> str:
    err = exc.errors()[0]
    loc = ".".join(str(p) for p in err.get("loc", ())) or "<root>"
    return f"{loc}: {err.get('msg')}"


def utcnow() -> datetime:
    return datetime.now(UTC)
