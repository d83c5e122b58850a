"""Composition root of the inventory service."""

from libs.runtime.service import ServiceRuntime
from services.inventory.config import InventorySettings
from services.inventory.handlers import InventoryHandlers, routes


async def main() -> None:
    settings = InventorySettings()
    runtime = ServiceRuntime("inventory", settings, migrations_package="services.inventory")
    await runtime.start()
    handlers = InventoryHandlers(runtime, settings)
    await runtime.mount(routes(handlers))
    runtime.background(handlers.node_sweeper(), "node-sweeper")
    runtime.background(handlers.maintenance(), "rollups-and-orphans")
    await runtime.run_until_signalled()
