"""Rooms of a readable size (issue #19): no module of `libs/` or `services/` over 800 lines, no function over 100
(a function that grows past that is split into named phases; a module, into modules). That no CLI module imports
the registry, nor any group another one's, is the `cli-layers` contract in .importlinter (test_architecture.py)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MAX_FILE_LINES = 800
MAX_FUNCTION_LINES = 100


def modules() -> list[Path]:
    return sorted(p for top in ("libs", "services") for p in (ROOT / top).rglob("*.py"))


def test_no_module_is_over_800_lines() -> None:
    sizes = {str(p.relative_to(ROOT)): len(p.read_text().splitlines()) for p in modules()}
    assert len(sizes) > 100 and "libs/cli/main.py" in sizes  # the tree was found
    assert {name: n for name, n in sizes.items() if n > MAX_FILE_LINES} == {}


def test_no_function_is_over_100_lines() -> None:
    long = []
    for path in modules():
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}() is {lines} lines")
    assert long == []
