"""`every`: a periodic step survives its failures; a lost deadlock is retried soon and logged as a warning."""

from __future__ import annotations

import asyncio
import logging

import pytest
from asyncpg.exceptions import DeadlockDetectedError

from libs.runtime.loops import every


async def test_a_deadlocked_step_is_retried_at_once_as_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    calls: list[int] = []

    async def step() -> None:
        calls.append(1)
        if len(calls) == 1:
            raise DeadlockDetectedError("deadlock detected")
        if len(calls) == 2:
            raise RuntimeError("a real fault")

    log = logging.getLogger("test-loops")
    with caplog.at_level(logging.WARNING, logger="test-loops"):
        task = asyncio.create_task(every(0.05, step, log=log, failure="sweep_failed"))
        while len(calls) < 3:
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    got = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert got[:2] == [("WARNING", "sweep_failed_conflict"), ("ERROR", "sweep_failed")]
