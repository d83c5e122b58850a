"""Composition root of the placement service: settings → runtime → handlers → routes → leader lease → scheduling
loop. Any number of replicas may run: all consume events into the shared read model, only the lease holder runs
scheduling cycles."""

from libs.bus.lease import LeaderLease
from libs.runtime.service import ServiceRuntime
from services.placement.config import PlacementSettings
from services.placement.handlers import PlacementHandlers, routes


async def main() -> None:
    settings = PlacementSettings()
    runtime = ServiceRuntime("placement", settings, migrations_package="services.placement")
    await runtime.start()
    lease = LeaderLease(runtime.js, "placement", runtime.instance, ttl_s=settings.lease_ttl_s,
                        renew_every_s=settings.lease_renew_s, replicas=settings.stream_replicas)
    handlers = PlacementHandlers(runtime, settings, lease)
    await runtime.mount(routes(handlers))
    runtime.background(handlers.reconcile_policy(), "policy-reconcile")
    runtime.background(lease.run(), "leader-lease")
    runtime.background(handlers.scheduling_loop(), "scheduling-loop")
    runtime.on_shutdown(lease.stop)
    await runtime.run_until_signalled()
