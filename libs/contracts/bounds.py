"""The bounds every event keeps, declared in its validation schema: events are input too
(libs/contracts/origins.py), so beside each model's own bounds no number in any event may be beyond what the
platform ever counts (a GPU total, a revision, bytes, seconds), nor any float non-finite, nor any text longer than
a log line's chunk. A forged 1e308 would otherwise reach arithmetic that overflows.

`BoundedModel` adds these bounds to every int, float, decimal and str of its own fields (list items, dict keys and values
included) when pydantic builds its schema, keeping any tighter bound a field declares: pydantic-core then refuses
an out-of-bounds value while it validates, with no Python walk over the values afterwards. A model nested in an
event is validated by its own class's validator, so every model an event holds is a `BoundedModel` too
(tests/unit/contracts/test_event_bounds.py checks every event type's schema, nested models included).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, GetCoreSchemaHandler
from pydantic_core import CoreSchema

MAX_EVENT_NUMBER = 2**53  # exact in a float and in JavaScript
MAX_EVENT_TEXT = 1 << 20
# schema keys that hold no value schema of this model: another model's (validated by its own validator), or
# functions and metadata
_SKIP = frozenset({"cls", "metadata", "ref", "serialization", "config", "function"})


def bound_schema(node: Any) -> None:
    """Add the event bounds to every int, float and str schema under `node` (in place), keeping tighter ones."""
    if isinstance(node, list):
        for item in node:
            bound_schema(item)
        return
    if not isinstance(node, dict):
        return
    kind = node.get("type")
    if kind in ("int", "float", "decimal"):
        if node.get("le") is None or node["le"] > MAX_EVENT_NUMBER:
            node["le"] = MAX_EVENT_NUMBER
        if node.get("ge") is None or node["ge"] < -MAX_EVENT_NUMBER:
            node["ge"] = -MAX_EVENT_NUMBER
        if kind != "int":
            node["allow_inf_nan"] = False
    elif kind == "str" and (node.get("max_length") is None or node["max_length"] > MAX_EVENT_TEXT):
        node["max_length"] = MAX_EVENT_TEXT
    for key, value in node.items():
        if key not in _SKIP:
            bound_schema(value)


class BoundedModel(BaseModel):
    """A model whose every number and text is within the event bounds, enforced by pydantic-core."""

    @classmethod
    def __get_pydantic_core_schema__(cls, source: type[BaseModel], handler: GetCoreSchemaHandler, /) -> CoreSchema:
        schema = handler(source)
        bound_schema(schema)
        return schema
