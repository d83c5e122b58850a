"""The inventory service run in-process on the test's NATS and database, for the inventory integration tests."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

from libs.runtime.service import ServiceRuntime
from services.inventory.config import InventorySettings
from services.inventory.handlers import InventoryHandlers
from services.inventory.handlers import routes as inventory_routes


@contextlib.asynccontextmanager
async def running_inventory(nats_url: str, database_url: str, instance: str,
                            **settings: Any) -> AsyncIterator[tuple[ServiceRuntime, InventoryHandlers]]:
    """Inventory with its sweeps effectively off (an hour apart) unless a test sets them; `settings` override."""
    config = InventorySettings(**{"nats_url": nats_url, "database_url": database_url, "http_port": 0,
                                  "log_level": "WARNING", "node_lost_after_s": 30, "node_sweep_interval_s": 3600,
                                  "instance": instance, "maintenance_interval_s": 3600, "rollup_late_s": 0,
                                  **settings})
    rt = ServiceRuntime("inventory", config, migrations_package="services.inventory")
    await rt.start()
    handlers = InventoryHandlers(rt, config)
    await rt.mount(inventory_routes(handlers))
    try:
        yield rt, handlers
    finally:
        await rt.shutdown()
