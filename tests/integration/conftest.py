"""Fixtures shared by the integration tests (the servers themselves come from tests/conftest.py)."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from libs.runtime import service as runtime_module


@pytest.fixture
def keep_test_logging_and_tracing(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A ServiceRuntime owns its process's logging and tracing; in a shared test process, put them back after."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    monkeypatch.setattr(runtime_module, "shutdown_tracing", lambda: None)
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
