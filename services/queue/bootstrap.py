"""Composition root of the queue service: settings → runtime → handlers → routes."""

from libs.runtime.service import ServiceRuntime
from services.queue.config import QueueSettings
from services.queue.handlers import QueueHandlers, routes


async def main() -> None:
    settings = QueueSettings()
    runtime = ServiceRuntime("queue", settings, migrations_package="services.queue")
    await runtime.start()
    handlers = QueueHandlers(runtime, settings)
    await runtime.mount(routes(handlers))
    runtime.background(handlers.autoscaler.run_forever(), "autoscale")
    runtime.background(handlers.report_queue_depth(), "queue-depth")
    runtime.background(handlers.sweep_requeues(), "requeue-backoff")
    await runtime.run_until_signalled()
