"""The boundaries that keep the tree readable are checked, not hoped for."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SERVICES = ("gateway", "inventory", "quota", "queue", "placement", "reclamation", "accounting", "agent")
SERVICE_SHAPE = ("README.md", "config.py", "domain.py", "handlers.py", "bootstrap.py", "main.py")


def test_import_linter_contracts_are_kept() -> None:
    lint = Path(sys.executable).with_name("lint-imports")
    result = subprocess.run([str(lint), "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert "0 broken" in result.stdout


def test_scheduling_core_imports_only_the_standard_library() -> None:
    offenders = []
    for path in (ROOT / "libs" / "core").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top not in sys.stdlib_module_names and name != "libs.core" and not name.startswith("libs.core."):
                    offenders.append(f"{path.relative_to(ROOT)}: {name}")
    assert offenders == []


def test_every_service_has_the_same_inner_shape() -> None:
    missing = [f"services/{s}/{f}" for s in SERVICES for f in SERVICE_SHAPE if not (ROOT / "services" / s / f).exists()]
    assert missing == []


def test_every_service_with_a_database_keeps_all_its_sql_in_store_py_and_numbered_migrations() -> None:
    for service in SERVICES:
        folder = ROOT / "services" / service
        migrations = sorted((folder / "migrations").glob("*.sql")) if (folder / "migrations").exists() else []
        if not migrations:
            continue
        assert (folder / "store.py").exists(), f"{service} has migrations but no store.py"
        numbers = [int(m.name.split("_")[0]) for m in migrations]
        assert numbers == list(range(1, len(numbers) + 1)), f"{service} migrations are not numbered 0001.."
        for module in folder.glob("*.py"):
            if module.name == "store.py":
                continue
            text = module.read_text()
            assert "conn.execute(" not in text and "conn.fetch" not in text, f"SQL outside store.py: {module}"


def test_test_modules_have_unique_names() -> None:
    """Test folders have no __init__.py, so pytest imports modules by basename: two files with one name in
    different folders break collection of the whole suite ("import file mismatch")."""
    import collections

    root = Path(__file__).resolve().parents[1]
    names = collections.Counter(p.name for p in root.rglob("test_*.py"))
    assert [n for n, k in names.items() if k > 1] == []
