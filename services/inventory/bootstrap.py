"""Composition root of the inventory service."""

from libs.runtime.service import ServiceRuntime
from services.inventory.config import InventorySettings
from services.inventory.handlers import InventoryHandlers, routes


async def main() -> None:
    settings = InventorySettings()
    runtime = ServiceRuntime("inventory", settings, migrations_package="services.inventory")
    await runtime.start()
    await runtime.mount(routes(InventoryHandlers(runtime)))
    await runtime.run_until_signalled()
