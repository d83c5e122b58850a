"""Polling with a deadline for the integration tests (pytest puts this folder on sys.path: `from waiting import
eventually`). Real servers answer asynchronously; tests wait for an outcome instead of sleeping a fixed time."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable


async def eventually(check: Callable[[], Awaitable[bool] | bool], timeout: float = 10.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if isinstance(result, Awaitable):
            result = await result
        if result:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what or check}")
        await asyncio.sleep(0.02)
