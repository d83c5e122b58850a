"""docs/benchmarks.md is written by several benchmarks, each owning one section between its own markers."""

from __future__ import annotations

from pathlib import Path


def write_section(path: Path, begin: str, end: str, section: str) -> None:
    """Replace the text between `begin` and `end` (the section includes both markers), or append the section;
    every other section stays byte for byte."""
    text = path.read_text() if path.exists() else "# Benchmarks\n"
    if begin in text and end in text:
        text = text[:text.index(begin)] + section + text[text.index(end) + len(end):]
    else:
        text = text.rstrip() + "\n\n" + section + "\n"
    path.write_text(text)
