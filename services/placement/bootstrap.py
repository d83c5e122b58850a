"""Composition root of the placement service: settings → runtime → handlers → routes → scheduling loop."""

from libs.runtime.service import ServiceRuntime
from services.placement.config import PlacementSettings
from services.placement.handlers import PlacementHandlers, routes


async def main() -> None:
    settings = PlacementSettings()
    runtime = ServiceRuntime("placement", settings, migrations_package="services.placement")
    await runtime.start()
    handlers = PlacementHandlers(runtime, settings)
    await runtime.mount(routes(handlers))
    runtime.background(handlers.scheduling_loop(), "scheduling-loop")
    await runtime.run_until_signalled()
