"""A service's periodic work (sweeps, reconciliations): one loop that survives its step's failures."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable


async def every(interval_s: float, step: Callable[[], Awaitable[object]], *, log: logging.Logger, failure: str,
                first_delay_s: float = 0.0) -> None:
    """Run `step` (after `first_delay_s`), then again `interval_s` after each run, until cancelled. A failing step
    is logged as `failure` with its traceback and the loop goes on; cancellation ends it."""
    if first_delay_s > 0:
        await asyncio.sleep(first_delay_s)
    while True:
        try:
            await step()
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception(failure)
        await asyncio.sleep(interval_s)
