"""The CLI stays in rooms of a readable size: one module per command group, none over 800 lines, no function over
100 (a `register` that grows past that is a new group's module). That no CLI module imports the registry, nor any
group another one's, is the `cli-layers` contract in .importlinter (test_architecture.py runs it)."""

from __future__ import annotations

import ast
from pathlib import Path

CLI = Path(__file__).resolve().parents[3] / "libs" / "cli"
MAX_FILE_LINES = 800
MAX_FUNCTION_LINES = 100


def test_no_cli_module_is_over_800_lines() -> None:
    sizes = {p.name: len(p.read_text().splitlines()) for p in sorted(CLI.glob("*.py"))}
    assert len(sizes) > 5  # the folder was found
    assert {name: n for name, n in sizes.items() if n > MAX_FILE_LINES} == {}


def test_no_cli_function_is_over_100_lines() -> None:
    long = []
    for path in sorted(CLI.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long.append(f"{path.name}:{node.lineno} {node.name}() is {lines} lines")
    assert long == []

