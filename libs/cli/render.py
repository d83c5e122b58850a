"""How the people-facing commands print: aligned tables, key/value blocks, the table / JSON / CSV output formats,
and the shared formatting of times, ages, durations, GPU counts and memory."""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, datetime
from typing import Any

from libs.client.models import ApiModel

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def cell(value: Any) -> str:
    """One table cell: None → "-", datetimes in UTC, floats short; control characters never reach the terminal."""
    if value is None or value == "":
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, datetime):
        return fmt_time(value)
    if isinstance(value, float):
        return f"{value:.1f}" if abs(value) < 1000 else f"{value:.0f}"
    if isinstance(value, list | tuple):
        return ",".join(cell(v) for v in value) or "-"
    return _CONTROL.sub(" ", str(value))


def _numeric(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """A plain aligned table: two spaces between columns, numeric columns right-aligned, no trailing blanks."""
    rows = [list(r) for r in rows]
    width = len(headers)
    for r in rows:
        if len(r) != width:
            raise ValueError(f"row has {len(r)} cells, table has {width} columns")
    right = [bool(rows) and all(_numeric(r[i]) or r[i] is None for r in rows)
             and any(_numeric(r[i]) for r in rows) for i in range(width)]
    text = [[cell(h) for h in headers]] + [[cell(v) for v in r] for r in rows]
    widths = [max(len(line[i]) for line in text) for i in range(width)]
    out = []
    for line in text:
        parts = [c.rjust(widths[i]) if right[i] else c.ljust(widths[i]) for i, c in enumerate(line)]
        out.append("  ".join(parts).rstrip())
    return "\n".join(out)


def key_values(pairs: Sequence[tuple[str, Any]]) -> str:
    pad = max(len(k) for k, _ in pairs) + 2
    return "\n".join(f"{(k + ':').ljust(pad)}{cell(v)}" for k, v in pairs)


def fmt_time(value: datetime | None) -> str:
    if value is None:
        return "-"
    if value.tzinfo is not None:
        value = value.astimezone(UTC)
    return value.strftime("%Y-%m-%d %H:%M:%S")


def fmt_age(value: datetime | None, now: datetime | None = None) -> str:
    if value is None:
        return "-"
    now = now or datetime.now(UTC)
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    seconds = max(0, int((now - value).total_seconds()))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def fmt_gib(mib: float | None) -> str:
    return "-" if mib is None else f"{mib / 1024:.1f}"


def num(value: float | None) -> int | float | None:
    """A GPU count or weight as people write it: 8, not 8.0; 0.5 stays 0.5."""
    if value is None or isinstance(value, bool):
        return value
    return int(value) if float(value).is_integer() else value


def fmt_duration(seconds: float | None) -> str | None:
    """3600 → "1h", 5400 → "1h30m", 90 → "1m30s"; None stays None."""
    if seconds is None:
        return None
    left, out = int(round(seconds)), []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if left >= size or (unit == "s" and not out):
            out.append(f"{left // size}{unit}")
            left %= size
    return "".join(out)


def emit(args: argparse.Namespace, raw: Any, render: Callable[[], str]) -> None:
    if args.output == "json":
        print(json.dumps(raw, indent=2, sort_keys=False, default=str))
    else:
        print(render())


def raws(items: Iterable[ApiModel]) -> list[dict[str, Any]]:
    return [i.raw for i in items]


def short(value: Any, width: int = 60) -> str:
    """A value in one cell at most `width` long: strings as they are, anything else as compact JSON."""
    if value is None:
        return "-"
    text = json.dumps(value, separators=(",", ":"), default=str) if not isinstance(value, str) else value
    return text if len(text) <= width else text[: width - 1] + "…"


# --- reports: fixed decimals, aligned as numbers ----------------------------------------------------------------------
_NUMBER = re.compile(r"^-?\d+(\.\d+)?%?$")


def fixed(value: Any, digits: int = 3) -> Any:
    """A float with `digits` decimals (as text); anything else as it is."""
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return value


def report_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """Like `table`, but numbers already formatted as text (fixed decimals) still align right."""
    text = [[cell(v) for v in r] for r in rows]
    right = [bool(text) and all(_NUMBER.match(r[i]) or r[i] == "-" for r in text) for i in range(len(headers))]
    widths = [max([len(h)] + [len(r[i]) for r in text]) for i, h in enumerate(headers)]
    out = []
    for line in [list(headers), *text]:
        parts = [c.rjust(widths[i]) if right[i] else c.ljust(widths[i]) for i, c in enumerate(line)]
        out.append("  ".join(parts).rstrip())
    return "\n".join(out)


def report_out(args: argparse.Namespace, raw: Any, csv_text: Callable[[], str], render: Callable[[], str]) -> None:
    if args.csv:
        sys.stdout.write(csv_text())
    elif args.output == "json" or args.json:
        print(json.dumps(raw, indent=2, default=str))
    else:
        print(render())


def range_line(report: Any) -> str:
    return f"{fmt_time(report.start)} → {fmt_time(report.end)} UTC (as of {fmt_time(report.as_of)})"
