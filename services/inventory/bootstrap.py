"""Composition root of the inventory service."""

import gc

from libs.runtime.service import ServiceRuntime
from services.inventory.config import InventorySettings
from services.inventory.fleet_metrics import fleet_metrics_loop
from services.inventory.handlers import InventoryHandlers, routes

# Telemetry allocates thousands of short-lived objects per batch (decoded samples, rows): with the default gen-0
# threshold of 700 the collector runs dozens of times per batch, and its full collections walk every object the
# service loaded at start. A higher threshold, and freezing what start-up built, cut inventory's CPU per sample by
# about a fifth (docs/benchmarks.md, inventory).
GC_THRESHOLD = (50_000, 20, 100)


async def main() -> None:
    settings = InventorySettings()
    runtime = ServiceRuntime("inventory", settings, migrations_package="services.inventory")
    await runtime.start()
    handlers = InventoryHandlers(runtime, settings)
    await runtime.mount(routes(handlers))
    runtime.background(handlers.node_sweeper(), "node-sweeper")
    runtime.background(handlers.maintenance(), "rollups-and-orphans")
    runtime.background(fleet_metrics_loop(runtime, settings), "fleet-metrics")
    gc.collect()
    gc.freeze()  # start-up's objects (modules, schemas, pools) live for the whole run: never scan them again
    gc.set_threshold(*GC_THRESHOLD)
    await runtime.run_until_signalled()
