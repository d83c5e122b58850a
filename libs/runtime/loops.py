"""A service's periodic work (sweeps, reconciliations): one loop that survives its step's failures."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from libs.store.database import CONFLICT_ERRORS


async def every(interval_s: float, step: Callable[[], Awaitable[object]], *, log: logging.Logger, failure: str,
                first_delay_s: float = 0.0) -> None:
    """Run `step` (after `first_delay_s`), then again `interval_s` after each run, until cancelled. A failing step
    is logged as `failure` with its traceback and the loop goes on; cancellation ends it. A step that lost a
    deadlock or a serialization conflict to a concurrent transaction (PostgreSQL rolled it back) is not a fault:
    it is logged as a warning, `<failure>_conflict`, and run again within a second."""
    if first_delay_s > 0:
        await asyncio.sleep(first_delay_s)
    while True:
        try:
            await step()
        except asyncio.CancelledError:
            raise
        except CONFLICT_ERRORS as e:
            log.warning(f"{failure}_conflict", extra={"error": type(e).__name__})
            await asyncio.sleep(min(interval_s, 1.0))
            continue
        except Exception:
            log.exception(failure)
        await asyncio.sleep(interval_s)
