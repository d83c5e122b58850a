"""Value types the services' domain modules share: plain data, no framework and no wire model (a handler turns
them into its replies). `Refusal`: a decision's no."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Refusal:
    """A decision's no: the HTTP-style status, the machine reason, the message, and what it names."""

    status: int
    reason: str
    message: str
    details: dict[str, Any] = field(default_factory=dict)
