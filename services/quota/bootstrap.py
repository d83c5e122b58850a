"""Composition root of the quota service."""

from libs.runtime.service import ServiceRuntime
from services.quota.config import QuotaSettings
from services.quota.handlers import QuotaHandlers, routes


async def main() -> None:
    settings = QuotaSettings()
    runtime = ServiceRuntime("quota", settings, migrations_package="services.quota")
    await runtime.start()
    handlers = QuotaHandlers(runtime)
    await handlers.seed([t.strip() for t in settings.seed_teams.split(",") if t.strip()])
    await runtime.mount(routes(handlers))
    runtime.background(handlers.sweep_loans(settings.loan_sweep_interval_s), "quota-loan-sweep")
    await runtime.run_until_signalled()
