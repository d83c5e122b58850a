"""Composition root of the placement service: settings → runtime → handlers → routes → leader lease → scheduling
loop. Any number of replicas may run: all consume events into the shared read model, only the lease holder runs
scheduling cycles."""

import gc

from libs.bus.lease import LeaderLease
from libs.contracts import subjects
from libs.runtime.routes import Routes
from libs.runtime.service import ServiceRuntime
from services.placement import store
from services.placement.config import PlacementSettings
from services.placement.handlers import PlacementHandlers, routes

# A cycle over a deep backlog allocates hundreds of thousands of short-lived objects (rows, requests, reasons): with
# the default gen-0 threshold of 700 the collector ran about 60 times a cycle, and the full collections that follow
# walked every object placement keeps between cycles (the kept scheduler, its read models) — some 40 ms of each
# turnover cycle at 1,024 nodes and 10,000 waiting jobs (`gpupool bench placement-cycle`). As inventory does.
GC_THRESHOLD = (50_000, 20, 100)


def tune_collector() -> None:
    """Start-up's objects (modules, schemas, pools) live for the whole run: never scan them again; and collect
    young objects less often."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLD)


async def main() -> None:
    settings = PlacementSettings()
    runtime = ServiceRuntime("placement", settings, migrations_package="services.placement")
    await runtime.start()
    async with runtime.pool.acquire() as conn:  # every replica has the same settings: any may write it
        await store.set_fair_share_half_life(conn, settings.fair_share_half_life_s)
    lease = LeaderLease(runtime.js, "placement", runtime.instance, ttl_s=settings.lease_ttl_s,
                        renew_every_s=settings.lease_renew_s, replicas=settings.stream_replicas)
    handlers = PlacementHandlers(runtime, settings, lease)
    table = routes(handlers)
    await runtime.mount(Routes(commands=table.commands))
    # Events: one durable shared by the replicas, each fetched batch applied in one transaction (a savepoint per
    # event; every handler's writes go through a unit of work and wake the cycle only after the commit). A short
    # ack_wait: a message handed to a replica that died comes back within seconds, not half a minute; a batch of
    # `consumer_batch` small handlers is acked well inside it (and a redelivery would be skipped by the inbox).
    await runtime.consume(runtime.name, table.event_subjects(), table.dispatch, batched=True,
                          ack_wait_s=settings.consumer_ack_wait_s, batch=settings.consumer_batch)
    await runtime.nc.subscribe(subjects.PLACEMENT_WAKE, cb=handlers.on_leader_wake)  # every replica: see _wake
    runtime.background(handlers.reconcile_forever(), "policy-reconcile")
    runtime.background(lease.run(), "leader-lease")
    runtime.background(handlers.scheduling_loop(), "scheduling-loop")
    runtime.background(handlers.fragmentation.gauges_forever(), "fragmentation-gauges")
    runtime.on_shutdown(lease.stop)
    tune_collector()
    await runtime.run_until_signalled()
