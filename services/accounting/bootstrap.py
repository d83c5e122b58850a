"""Composition root of the accounting service."""

from libs.runtime.service import ServiceRuntime
from services.accounting.config import AccountingSettings
from services.accounting.handlers import AccountingHandlers, routes


async def main() -> None:
    settings = AccountingSettings()
    runtime = ServiceRuntime("accounting", settings, migrations_package="services.accounting")
    await runtime.start()
    await runtime.mount(routes(AccountingHandlers(runtime)))
    await runtime.run_until_signalled()
