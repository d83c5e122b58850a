"""Composition root of the reclamation service."""

from libs.runtime.service import ServiceRuntime
from services.reclamation.config import ReclamationSettings
from services.reclamation.handlers import ReclamationHandlers, routes


async def main() -> None:
    settings = ReclamationSettings()
    runtime = ServiceRuntime("reclamation", settings, migrations_package="services.reclamation")
    await runtime.start()
    handlers = ReclamationHandlers(runtime, settings)
    await runtime.mount(routes(handlers))
    runtime.background(handlers.sweep_loop(), "reclaim-sweep")
    await runtime.run_until_signalled()
