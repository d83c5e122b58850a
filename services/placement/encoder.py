"""A recorded decision's JSON (`libs.core.codec`'s text, exactly), made cheaply from one cycle to the next."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Iterable
from typing import Any
from uuid import uuid4

from libs.core import JobRequest, Plan, Policy, Snapshot, codec


@dataclasses.dataclass(frozen=True)
class Encoded:
    """A codec text kept as its frame and its long lists: `frame` is the text with each list written as its token
    (a JSON string, `tokens[name]`), `lists[name]` the JSON text of each of that list's items, in order. `text()`
    puts them together: the codec's text, exactly. Kept apart, a cycle's lists can be recorded as what changed
    against an earlier cycle's (services/placement/recording.py)."""

    frame: str
    tokens: dict[str, str]
    lists: dict[str, list[str]]

    def text(self) -> str:
        text = self.frame
        for name, token in self.tokens.items():
            text = text.replace(token, "[" + ",".join(self.lists[name]) + "]", 1)
        return text


class DecisionEncoder:
    """`codec.dumps` of a cycle's input and plan, exactly (same text, same digests), reusing the JSON of the items
    seen in recent cycles: the pool, what runs and the backlog barely change from one cycle to the next, and
    encoding them again was most of what recording a decision cost. Call `turn()` after each recorded cycle: what
    that cycle did not use is forgotten."""

    def __init__(self) -> None:
        self._old: dict[Any, str] = {}
        self._new: dict[Any, str] = {}
        # the same by the very object (id -> (object, text); the entry keeps it alive, so its id stays its own):
        # a cycle meets most objects of the last one again, and hashing a node's or a request's fields each
        # time cost more than encoding them once. Kept across cycles, and pruned to what the last recorded cycle
        # used once it holds more than twice that (one lookup per item, not a move from an old dict to a new one)
        self._ids: dict[int, tuple[Any, str]] = {}
        self._texts: dict[int, str] = {}  # the same, id -> text alone (what `_list` looks up)
        self._used: list[tuple] = []  # the lists encoded since the last turn
        self._token = f"\x1e{uuid4().hex}:"  # stands in for a list while the rest is encoded
        self._last_list: tuple[tuple | None, list[str]] = (None, [])  # the last list encoded (kept alive), its items

    def turn(self) -> None:
        self._old, self._new = self._new, {}
        used, self._used = self._used, []
        if len(self._ids) > 2 * sum(map(len, used)):
            ids = self._ids
            self._ids = {id(v): ids[id(v)] for values in used for v in values if id(v) in ids}
            self._texts = {key: hit[1] for key, hit in self._ids.items()}
        self._last_list = (None, [])

    def _item(self, value: Any) -> str:
        key = id(value)
        seen = self._ids.get(key)
        if seen is not None and seen[0] is value:
            return seen[1]
        try:
            text = self._new.get(value)
            if text is None:
                text = self._old.get(value) or codec.dumps(value)
                self._new[value] = text
        except TypeError:  # not hashable (nor, then, known to be immutable)
            return codec.dumps(value)
        self._ids[key] = (value, text)
        self._texts[key] = text
        return text

    def _list(self, values: tuple) -> list[str]:
        """Each item's JSON text: the texts of objects met before looked up by their ids without a Python step per
        item (10,000s a cycle), then the others encoded. An id found is the very object's: `_ids` keeps the object
        it was taken from alive, so no other object can have that id meanwhile."""
        if values is self._last_list[0]:  # a plan's reasons: its JSON and its digest encode them both
            return self._last_list[1]
        self._used.append(values)
        parts = list(map(self._texts.get, map(id, values)))
        if None in parts:
            for i in [i for i, text in enumerate(parts) if text is None]:
                parts[i] = self._item(values[i])
        self._last_list = (values, parts)
        return parts

    def _compose(self, value: Any, lists: dict[str, tuple]) -> Encoded:
        return Encoded(codec.dumps(value), {name: json.dumps(self._token + name) for name in lists},
                       {name: self._list(values) for name, values in lists.items()})

    def input_parts(self, snapshot: Snapshot, pending: Iterable[JobRequest], policy: Policy, now: float) -> Encoded:
        """codec.dumps({"snapshot": snapshot, "pending": tuple(pending), "policy": policy, "now": now}), as its
        frame and its lists (the nodes, the waiting requests and what runs)."""
        lists: dict[str, tuple] = {"nodes": snapshot.nodes, "pending": tuple(pending)}
        swap: dict[str, Any] = {"nodes": self._token + "nodes"}
        if snapshot.running:  # an empty field equal to its default is left out of the encoding
            lists["running"], swap["running"] = snapshot.running, self._token + "running"
        return self._compose({"snapshot": dataclasses.replace(snapshot, **swap), "pending": self._token + "pending",
                              "policy": policy, "now": now}, lists)

    def input_json(self, snapshot: Snapshot, pending: Iterable[JobRequest], policy: Policy, now: float) -> str:
        """codec.dumps({"snapshot": snapshot, "pending": tuple(pending), "policy": policy, "now": now})."""
        return self.input_parts(snapshot, pending, policy, now).text()

    def plan_parts(self, plan: Plan) -> Encoded:
        """codec.dumps(plan), as its frame and its pending reasons."""
        return self._compose(dataclasses.replace(plan, pending=self._token + "pending"), {"pending": plan.pending})

    def plan_json(self, plan: Plan) -> str:
        """codec.dumps(plan)."""
        return self.plan_parts(plan).text()

    def plan_digest(self, plan: Plan) -> str:
        """codec.plan_digest(plan)."""
        parts = (codec.dumps(plan.placements), "[" + ",".join(self._list(plan.pending)) + "]",
                 codec.dumps(plan.preemptions), codec.dumps(plan.mig_reconfigs), codec.dumps(plan.reservations))
        return hashlib.sha256(("[" + ",".join(parts) + "]").encode()).hexdigest()
