"""Composition root of the accounting service."""

from libs.contracts import subjects
from libs.runtime.service import ServiceRuntime
from services.accounting.config import AccountingSettings
from services.accounting.handlers import AccountingHandlers, routes


async def main() -> None:
    settings = AccountingSettings()
    runtime = ServiceRuntime("accounting", settings, migrations_package="services.accounting")
    await runtime.start()
    handlers = AccountingHandlers(runtime, settings)
    await mount(runtime, handlers)
    runtime.background(handlers.prune_loop(), "rollup-prune")
    await runtime.run_until_signalled()


async def mount(runtime: ServiceRuntime, handlers: AccountingHandlers) -> None:
    """The routing table (events on GPUPOOL_EVENTS, queries, commands) plus inventory's rollups, which live on
    their own stream and get their own durable consumer."""
    await runtime.mount(routes(handlers))
    await runtime.consume("accounting-rollups", (subjects.ROLLUP_ALL,), handlers.on_rollup,
                          stream=subjects.ROLLUPS_STREAM.name, batch=256)
