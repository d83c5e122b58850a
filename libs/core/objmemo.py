"""Values derived from objects, looked up by the objects' identity without a Python step per object (`ByObject`).

A cycle meets the same objects again and again: the wanted jobs' rows, the requests built from them, the live
allocations, the reasons of a backlog. Deriving something from each of 10,000 of them, even from a memo checked
item by item, was milliseconds per pass and there were many passes. `ByObject.of` maps the ids through a dict in C
and derives only what it has not seen. An id found is the very object's: an entry keeps its object alive, so no
other object can have that id while the entry is there.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from itertools import repeat
from typing import Any

_MISSING: Any = object()


class ByObject:
    """`derive(obj)` for each of a sequence of objects, remembered by the object (see the module). Entries not used
    by the last call are dropped once they are more than the objects it was given."""

    def __init__(self, derive: Callable[[Any], Any] | None = None) -> None:
        self._derive = derive or (lambda obj: None)
        self._values: dict[int, Any] = {}  # id -> derived value
        self._alive: dict[int, Any] = {}  # id -> the object (keeps it, so its id stays its own)

    def of(self, objs: Sequence[Any], derive: Callable[[Any], Any] | None = None) -> list[Any]:
        """Each object's value (`derive`, when given, works out the ones not seen before this time)."""
        got = list(map(self._values.get, map(id, objs), repeat(_MISSING)))
        if _MISSING in got:
            derive, values, alive = derive or self._derive, self._values, self._alive
            for i in [i for i, v in enumerate(got) if v is _MISSING]:
                obj = objs[i]
                got[i] = values[id(obj)] = derive(obj)
                alive[id(obj)] = obj
        if len(self._values) > 2 * len(objs) + 64:  # forget what the last call did not use
            keep = set(map(id, objs))
            self._values = {k: v for k, v in self._values.items() if k in keep}
            self._alive = {k: v for k, v in self._alive.items() if k in keep}
        return got
