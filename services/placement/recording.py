"""A recorded decision kept as what changed against an earlier one (a keyframe), not whole every cycle.

A cycle's recorded input is the whole pool, everything running and the whole backlog (`gpupool decisions
replay` schedules it again); from one cycle to the next almost none of it changes. Writing it whole — megabytes of
JSON at fleet size, gzipped and inserted each cycle — was the largest part of a turnover cycle's store phase, and
`decision_retention` copies of it the largest part of placement's database. `DeltaRecorder` writes a keyframe (every
item's text) now and then and, in between, each list as runs of the keyframe's items plus the items it does not
have. `expand` gives back the exact texts (and so the digests) that were recorded.

The record is text: a JSON header, then one section per list, each a line per item (an item's text is compact
JSON: it has no newline) or, in a delta, a line per operation: `=start,count` (that many of the keyframe's items
from `start`), `@p1,p2,…` (the keyframe's items at those positions, one each; JSON starts with neither `=` nor
`@`) or an item's text. Sections are separated by a group separator (`\\x1d`),
which JSON never holds unescaped.

Pure: no I/O. The handler stores the record, gives its base's cycle id with it, and tells the recorder when the
cycle committed: a keyframe is a base only once it is in the store.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Mapping
from dataclasses import dataclass
from itertools import compress, islice, repeat
from operator import sub
from typing import Any

from services.placement.encoder import Encoded

SEP = "\x1d"
FORMAT = 1
KEYFRAME_EVERY = 100  # recorded cycles between keyframes at most
LITERAL_SHARE = 0.25  # a delta with more new items than this share of all is written as a keyframe instead


class RecordError(ValueError):
    """A stored record that cannot be read back (corrupt, or a delta without its keyframe)."""


@dataclass
class _Keyframe:
    cycle_id: str
    index: dict[tuple[str, str], dict[str, int]]  # (part, list) -> item text -> its first position
    lists: dict[tuple[str, str], list[str]]


def _sections(parts: dict[str, Encoded]) -> list[tuple[str, str]]:
    return [(part, name) for part, enc in sorted(parts.items()) for name in sorted(enc.lists)]


def _delta(items: list[str], index: dict[str, int]) -> tuple[list[str], int]:
    """The operations that rebuild `items` from the keyframe's list, and how many items are new. The runs are found
    without a Python step per item (tens of thousands a cycle, almost all in a few long runs): each item's keyframe
    position (-2: not there), then where a position does not follow the one before, each such break starting a
    run of the keyframe's items or one new item (two new items in a row never follow each other). Runs of one item
    in a row — a queue that fair share reordered is thousands of them — are one `@` operation listing positions."""
    if not items:
        return [], 0
    n = len(items)
    pos = list(map(index.get, items, repeat(-2, n)))
    starts = [0, *compress(range(1, n), map((1).__ne__, map(sub, islice(pos, 1, None), pos)))]
    ops: list[str] = []
    singles: list[int] = []
    new = 0
    for start, end in zip(starts, [*islice(starts, 1, None), n], strict=True):
        at = pos[start]
        if at >= 0 and end - start == 1:
            singles.append(at)
            continue
        if singles:
            ops.append("@" + ",".join(map(str, singles)))
            singles = []
        if at < 0:
            ops.append(items[start])
            new += 1
        else:
            ops.append(f"={at},{end - start}")
    if singles:
        ops.append("@" + ",".join(map(str, singles)))
    return ops, new


class DeltaRecorder:
    """Turns each recorded cycle's encodings into the record to store and its base (`record`); `committed` after the
    cycle's transaction committed, `forget` after one failed or another replica led (the store may hold other
    keyframes than this replica knows)."""

    def __init__(self, every: int = KEYFRAME_EVERY) -> None:
        self._every = every
        self._base: _Keyframe | None = None
        self._since = 0  # deltas recorded against the base
        self._staged: tuple[str, dict[tuple[str, str], list[str]]] | None = None  # a keyframe not yet committed

    def record(self, cycle_id: str, parts: dict[str, Encoded]) -> tuple[str | None, str]:
        """(the keyframe's cycle id or None when this record is one, the record's text)."""
        sections = _sections(parts)
        base = self._base
        self._staged = None
        if base is not None and self._since < self._every and set(base.lists) == set(sections):
            ops, new, total = [], 0, 0
            for part, name in sections:
                items = parts[part].lists[name]
                o, n = _delta(items, base.index[(part, name)])
                ops.append(o)
                new, total = new + n, total + len(items)
            if new <= LITERAL_SHARE * total:
                self._since += 1
                return base.cycle_id, _text(parts, sections, ops, delta=True)
        lists = {(part, name): parts[part].lists[name] for part, name in sections}
        self._staged = (cycle_id, lists)
        return None, _text(parts, sections, [lists[s] for s in sections], delta=False)

    def committed(self) -> None:
        """The last recorded cycle is in the store: a keyframe it wrote is the base from now on."""
        if self._staged is not None:
            cycle_id, lists = self._staged
            index = {key: {} for key in lists}
            for key, items in lists.items():
                seen = index[key]
                for i, text in enumerate(items):
                    seen.setdefault(text, i)
            self._base, self._since, self._staged = _Keyframe(cycle_id, index, lists), 0, None

    def forget(self) -> None:
        self._base, self._since, self._staged = None, 0, None


def _text(parts: dict[str, Encoded], sections: list[tuple[str, str]], bodies: list[list[str]], *, delta: bool) -> str:
    header = {"format": FORMAT, "delta": delta, "sections": [list(s) for s in sections],
              "parts": {part: {"frame": enc.frame, "tokens": enc.tokens} for part, enc in sorted(parts.items())}}
    return SEP.join([json.dumps(header, separators=(",", ":")), *("\n".join(b) for b in bodies)])


def _read(record: str) -> tuple[dict, dict[tuple[str, str], list[str]]]:
    """The record's header and each section's lines, by (part, list)."""
    head, *bodies = record.split(SEP)
    try:
        header = json.loads(head)
        sections = [tuple(s) for s in header["sections"]]
        parts = header["parts"]
    except (ValueError, KeyError, TypeError) as e:
        raise RecordError(f"unreadable record header: {e}") from e
    if not isinstance(parts, dict) or any((p, n) not in sections for p, e in parts.items() for n in e["tokens"]):
        raise RecordError("a record's parts do not match its sections")
    if header.get("format") != FORMAT or len(bodies) != len(sections):
        raise RecordError(f"record of format {header.get('format')!r} with {len(bodies)} sections for "
                          f"{len(sections)}")
    return header, dict(zip(sections, (b.split("\n") if b else [] for b in bodies), strict=True))


def expand(record: str, base: str | None = None) -> dict[str, str]:
    """Each part's text (`Encoded.text()` as recorded) from a record and, for a delta, its keyframe's record."""
    header, lists = _read(record)
    if header["delta"]:
        if base is None:
            raise RecordError("a delta record without its keyframe")
        kf_header, kf = _read(base)
        if kf_header["delta"]:
            raise RecordError("a delta's base is itself a delta")
        lists = {key: _apply(ops, kf.get(key)) for key, ops in lists.items()}
    out = {}
    for part, p in header["parts"].items():
        names = {name: items for (q, name), items in lists.items() if q == part}
        out[part] = Encoded(p["frame"], p["tokens"], names).text()
    return out


def _apply(ops: list[str], items: list[str] | None) -> list[str]:
    if items is None:
        raise RecordError("a delta's list is not in its keyframe")
    out: list[str] = []
    for op in ops:
        if op.startswith("="):
            start, _, count = op[1:].partition(",")
            a, n = int(start), int(count)
            if a < 0 or n < 1 or a + n > len(items):
                raise RecordError(f"a delta's run {op} outside its keyframe's {len(items)} items")
            out.extend(items[a:a + n])
        elif op.startswith("@"):  # single items of the keyframe, by position
            at = [int(x) for x in op[1:].split(",")]
            if min(at) < 0 or max(at) >= len(items):
                raise RecordError(f"a delta's positions outside its keyframe's {len(items)} items")
            out.extend(map(items.__getitem__, at))
        else:
            out.append(op)
    return out


def stored_texts(row: Mapping[str, Any]) -> tuple[str, str]:
    """A `decisions` row's recorded input and plan texts (`record_gz`, with its keyframe's `base_gz` for a
    delta; rows recorded before deltas hold `input_gz` and `plan_json`)."""
    if row["record_gz"] is None:
        return gzip.decompress(row["input_gz"]).decode(), row["plan_json"]
    base = gzip.decompress(row["base_gz"]).decode() if row["base_gz"] is not None else None
    texts = expand(gzip.decompress(row["record_gz"]).decode(), base)
    return texts["input"], texts["plan"]
