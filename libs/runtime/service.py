"""The composition every service shares: observability, NATS + streams, its own database + migrations, the
outbox relay and its retention, consumers and request/reply handlers, and graceful shutdown.

Shutdown order matters: stop fetching → finish the message in hand → stop answering requests → flush the outbox
→ drain the NATS connection → close the pool. A SIGKILL skips all of it and still loses nothing: unacked messages
are redelivered and committed outbox rows are published on the next start.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import signal
import socket
from collections.abc import Awaitable, Callable
from typing import Any

from libs.bus.batch import BatchConsumer
from libs.bus.connection import connect, ensure_streams, identity_inbox, wait_for_streams
from libs.bus.consumer import ConsumerSpec, EventConsumer, Handler
from libs.bus.publisher import publish_raw, publish_raw_batch
from libs.bus.rpc import serve
from libs.contracts import subjects
from libs.contracts.commands import Command, Empty
from libs.contracts.subjects import EVENTS_STREAM, TELEMETRY_STREAM
from libs.observability.logging import setup_logging
from libs.observability.tracing import enter_background, setup_tracing, shutdown_tracing
from libs.runtime.http import OpsEndpoint
from libs.runtime.routes import Routes
from libs.runtime.settings import ServiceSettings
from libs.store.database import Pool, create_pool, database_name, ensure_database, with_database
from libs.store.migrations import migrate, package_migrations, store_migrations
from libs.store.outbox_relay import OutboxRelay
from libs.store.retention import Pruner
from libs.store.unit_of_work import BatchTransaction, UnitOfWork

log = logging.getLogger(__name__)


class ServiceRuntime:
    def __init__(self, name: str, settings: ServiceSettings, *, migrations_package: str | None) -> None:
        self.name = name
        self.settings = settings
        self.migrations_package = migrations_package
        self.instance = settings.instance or f"{socket.gethostname()}:{os.getpid()}"
        self.source = f"/gpupool/{name}"
        self.consumers: list[EventConsumer] = []
        self._subs: list[Any] = []
        self._tasks: list[asyncio.Task[Any]] = []
        self._shutdown_hooks: list[Callable[[], Awaitable[None]]] = []
        self._stop = asyncio.Event()
        self.pool: Pool | None = None
        self.relay: OutboxRelay | None = None
        self.pruner: Pruner | None = None
        self.http: OpsEndpoint | None = None

    # --- start ----------------------------------------------------------------------------------------------
    async def start(self) -> None:
        setup_logging(self.name, self.settings.log_level)
        setup_tracing(self.name)
        enter_background()  # loops started from here on record no spans (libs/observability/tracing.py)
        self.nc = await connect(self.settings.nats_url, f"gpupool-{self.name}", user=self.settings.nats_user,
                                password=self.settings.nats_password, nkey_file=self.settings.nats_nkey_file,
                                inbox_prefix=identity_inbox(self.name, self.settings.nats_inbox_prefix,
                                                             self.settings.nats_nkey_file))
        self.js = self.nc.jetstream()
        if self.settings.declare_streams:
            await ensure_streams(self.js, replicas=self.settings.stream_replicas)
        else:
            await wait_for_streams(self.js)
        if self.migrations_package is not None:
            dsn = self.settings.database_url
            await ensure_database(with_database(dsn, "postgres"), database_name(dsn), dsn)
            # services keep no session state on pooled connections (migrate unlocks its session lock itself)
            self.pool = await create_pool(dsn, reset_session=False)
            await migrate(self.pool, store_migrations() + package_migrations(self.name, self.migrations_package))
            self.relay = OutboxRelay(self.pool, functools.partial(publish_raw, self.js), self.name,
                                     publish_batch=functools.partial(publish_raw_batch, self.js))
            self.relay.start()
            self.pruner = Pruner(self.pool, self.name, outbox_retention_s=self.settings.outbox_retention_s,
                                 inbox_retention_s=self.settings.inbox_retention_s,
                                 interval_s=self.settings.retention_interval_s)
            self.pruner.start()
        self.http = OpsEndpoint(self.settings.http_host, self.settings.http_port, self.ready,
                                self.settings.http_fd)
        port = await self.http.start()
        await self.serve(subjects.health_ping(self.name), Empty, self._ping)
        self.background(self._report_consumer_lag(), "consumer-lag")
        log.info("service_started", extra={"instance": self.instance, "http_port": port})

    async def _report_consumer_lag(self) -> None:
        """Consumer lag and unacknowledged messages on /metrics, read from JetStream every metrics interval."""
        while True:
            await asyncio.sleep(self.settings.metrics_interval_s)
            for consumer in list(self.consumers):
                try:
                    await consumer.report_lag()
                except Exception as exc:  # a blip; the next round tries again
                    log.debug("consumer_lag_unavailable", extra={"consumer": consumer.spec.durable,
                                                                 "error": repr(exc)})

    async def _ping(self, _: Empty) -> dict[str, str]:
        return {"service": self.name, "instance": self.instance}

    async def ready(self) -> bool:
        if not self.nc.is_connected:
            return False
        if self.pool is not None:
            try:
                async with self.pool.acquire() as conn:
                    await conn.fetchval("SELECT 1")
            except Exception:
                return False
        return True

    # --- building blocks for handlers -------------------------------------------------------------------------
    def uow(self) -> UnitOfWork:
        assert self.pool is not None, f"{self.name} has no database"
        return UnitOfWork(self.pool, self.source, on_commit=self.relay.wake if self.relay else None)

    def batch_transaction(self) -> BatchTransaction:
        assert self.pool is not None, f"{self.name} has no database"
        return BatchTransaction(self.pool)

    async def consume(self, durable: str, filter_subjects: tuple[str, ...], handler: Handler, *,
                      stream: str = EVENTS_STREAM.name, batched: bool = False, **spec: Any) -> EventConsumer:
        """`batched`: apply each fetched batch in one transaction (libs.bus.consumer); only for handlers whose
        database work all goes through units of work (see libs.store.unit_of_work)."""
        consumer = EventConsumer(self.js, ConsumerSpec(stream=stream, durable=durable,
                                                       filter_subjects=filter_subjects, **spec), handler,
                                 transaction=self.batch_transaction if batched else None)
        await consumer.start()
        self.consumers.append(consumer)
        return consumer

    async def serve(self, subject: str, command: type[Command], handler: Callable[[Any], Awaitable[Any]],
                    subject_check: Callable[[str, Any], str | None] | None = None) -> None:
        self._subs.append(await serve(self.nc, subject, command, handler, queue=self.name,
                                      subject_check=subject_check))

    async def mount(self, routes: Routes) -> None:
        """Serve the routing table's commands and start its consumers (durable names derive from the service)."""
        for subject, (command, handler) in routes.commands.items():
            await self.serve(subject, command, handler, routes.subject_checks.get(subject))
        if routes.events:
            await self.consume(self.name, routes.event_subjects(), routes.dispatch, batched=routes.batched)
        if routes.telemetry is not None and routes.telemetry_batch is not None:
            consumer = BatchConsumer(self.js, ConsumerSpec(
                stream=TELEMETRY_STREAM.name, durable=f"{self.name}-telemetry", filter_subjects=(subjects.TELEMETRY_ALL,),
                max_deliver=3, batch=256), routes.dispatch_telemetry_batch, routes.dispatch_telemetry)
            await consumer.start()
            self.consumers.append(consumer)
        elif routes.telemetry is not None:
            await self.consume(f"{self.name}-telemetry", (subjects.TELEMETRY_ALL,), routes.dispatch_telemetry,
                               stream=TELEMETRY_STREAM.name, max_deliver=3, batch=256, batched=routes.batched)

    def on_shutdown(self, hook: Callable[[], Awaitable[None]]) -> None:
        """Run `hook` during shutdown, after consumers stopped and before the NATS connection drains."""
        self._shutdown_hooks.append(hook)

    def background(self, coro: Awaitable[Any], name: str) -> None:
        self._tasks.append(asyncio.ensure_future(coro))
        self._tasks[-1].set_name(name)

    # --- run and stop ------------------------------------------------------------------------------------------
    def request_stop(self) -> None:
        self._stop.set()

    async def run_until_signalled(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.request_stop)
        await self._stop.wait()
        await self.shutdown()

    async def shutdown(self) -> None:
        log.info("service_stopping", extra={"instance": self.instance})
        for consumer in self.consumers:
            await consumer.stop()
        for sub in self._subs:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
        for hook in self._shutdown_hooks:
            with contextlib.suppress(Exception):
                await hook()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        # Each step is bounded: with NATS or PostgreSQL gone, a graceful stop must still end.
        if self.pruner is not None:
            await self.pruner.stop()
        if self.relay is not None:
            await _bounded(self.relay.stop(), 15)
        await _bounded(self.nc.drain(), 10)
        if self.pool is not None:
            await _bounded(self.pool.close(), 10)
        if self.http is not None:
            await self.http.stop()
        shutdown_tracing()
        log.info("service_stopped", extra={"instance": self.instance})


async def _bounded(step: Awaitable[Any], seconds: float) -> None:
    try:
        await asyncio.wait_for(step, timeout=seconds)
    except (TimeoutError, Exception) as exc:
        log.warning("shutdown_step_abandoned", extra={"error": repr(exc), "after_s": seconds})


def run_service(main: Callable[[], Awaitable[None]]) -> None:
    """Entry point for `python -m services.<name>`: run the service's async main, exit 0 on a clean stop.

    uvloop (a libuv event loop) when installed: every service is I/O-bound on NATS and PostgreSQL round trips,
    where it cuts the loop's own overhead substantially; plain asyncio otherwise."""
    try:
        import uvloop
    except ImportError:
        runner = asyncio.run
    else:
        runner = uvloop.run
    with contextlib.suppress(KeyboardInterrupt):
        runner(main())

