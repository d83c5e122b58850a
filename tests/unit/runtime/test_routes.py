"""Routing tables (libs/runtime/routes.py): every event route says whether the inbox applies it once or it is
idempotent by design, and a route declared applied once skips an event the inbox already holds (the inbox itself is
an in-memory stand-in here; tests/integration/test_store.py runs the same against PostgreSQL and NATS)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest

from libs.contracts.envelope import CloudEvent
from libs.contracts.events import (
    JobSubmitted,
    PriorityClassSet,
    QuotaSet,
    TeamCreated,
    TelemetrySampled,
    WorkLoadSampled,
)
from libs.runtime.routes import EventRoute, Routes, idempotent, once
from libs.store.unit_of_work import UnitOfWork
from services.accounting.handlers import routes as accounting_routes
from services.inventory.handlers import routes as inventory_routes
from services.placement.handlers import routes as placement_routes
from services.queue.handlers import routes as queue_routes
from services.quota.handlers import routes as quota_routes
from services.reclamation.handlers import routes as reclamation_routes

SERVICE_ROUTES: dict[str, Callable[[Any], Routes]] = {
    "accounting": accounting_routes, "inventory": inventory_routes, "placement": placement_routes,
    "queue": queue_routes, "quota": quota_routes, "reclamation": reclamation_routes,
}
# The routes that skip the inbox on purpose. Growing this list is a decision: say why in the route.
IDEMPOTENT_BY_DESIGN = {
    "placement": {TeamCreated, QuotaSet, PriorityClassSet},  # revision-guarded policy rows
    "queue": {WorkLoadSampled},  # the latest sample per replica
    "inventory": {TelemetrySampled},
    "reclamation": {TelemetrySampled},
}


class _Handlers:
    """Stands in for a service's handlers object: every attribute path is a distinct handler (by name)."""

    def __init__(self, path: str = "h") -> None:
        self.path = path

    def __getattr__(self, name: str) -> _Handlers:
        if name.startswith("__"):
            raise AttributeError(name)
        return _Handlers(f"{self.path}.{name}")


@pytest.mark.parametrize("service", sorted(SERVICE_ROUTES))
def test_every_event_route_of_every_service_declares_how_it_applies_an_event_once(service: str) -> None:
    table = SERVICE_ROUTES[service](_Handlers())
    routes: dict[type, Any] = dict(table.events)
    if table.telemetry is not None:
        routes[TelemetrySampled] = table.telemetry
    assert routes, f"{service} consumes no events"
    assert all(isinstance(r, EventRoute) for r in routes.values())
    assert {t for t, r in routes.items() if not r.applied_once} == IDEMPOTENT_BY_DESIGN.get(service, set())
    assert all(r.why for r in routes.values() if not r.applied_once)
    assert table.inbox == service  # the inbox key each service has always used: rows already there still count


async def _noop(event: CloudEvent, data: Any) -> None:
    return None


def test_a_route_that_does_not_say_how_it_applies_an_event_once_is_refused() -> None:
    with pytest.raises(TypeError, match="once\\(...\\) or idempotent"):
        Routes(inbox="svc", events={JobSubmitted: _noop})  # type: ignore[dict-item]
    with pytest.raises(TypeError, match="once\\(...\\) or idempotent"):
        Routes(inbox="svc", telemetry=_noop)  # type: ignore[arg-type]


def test_an_idempotent_route_says_why_and_applied_once_routes_name_their_inbox() -> None:
    with pytest.raises(ValueError, match="says why"):
        idempotent(_noop, "  ")
    with pytest.raises(ValueError, match="inbox's consumer name"):
        Routes(events={JobSubmitted: once(_noop)})
    with pytest.raises(ValueError, match="must be idempotent"):
        Routes(inbox="svc", telemetry=once(_noop), telemetry_batch=_noop)  # type: ignore[arg-type]
    assert Routes(events={JobSubmitted: idempotent(_noop, "upsert")}).inbox == ""  # no inbox needed


# --- the check itself, against an in-memory inbox ---------------------------------------------------------------
class _Transaction:
    def __init__(self, conn: _Conn) -> None:
        self.conn = conn

    async def start(self) -> None:
        self.conn.pending = set()

    async def commit(self) -> None:
        self.conn.db.inbox |= self.conn.pending
        self.conn.db.effects += self.conn.effects
        self.conn.db.commits += 1

    async def rollback(self) -> None:
        self.conn.db.rollbacks += 1


class _Conn:
    def __init__(self, db: _Db) -> None:
        self.db = db
        self.pending: set[tuple[str, str]] = set()
        self.effects: list[str] = []

    def transaction(self) -> _Transaction:
        self.effects = []
        return _Transaction(self)

    async def fetchval(self, sql: str, consumer: str, event_id: str) -> int | None:
        assert sql.startswith("INSERT INTO inbox")
        key = (consumer, event_id)
        if key in self.db.inbox or key in self.pending:
            return None
        self.pending.add(key)
        return 1


class _Db:
    """A pool of one connection with an inbox table: what a unit of work touches when it only records events."""

    def __init__(self) -> None:
        self.inbox: set[tuple[str, str]] = set()
        self.effects: list[str] = []
        self.commits = self.rollbacks = 0

    async def acquire(self) -> _Conn:
        return _Conn(self)

    async def release(self, conn: _Conn) -> None:
        return None


def _event(job_id: str) -> tuple[CloudEvent, JobSubmitted]:
    data = JobSubmitted(job_id=job_id, name="train", team="ml", project="default", kind="training",
                        priority_class="normal", priority=500, gpus=1, submitted_at=datetime(2026, 1, 1, tzinfo=UTC))
    return data.to_cloudevent("/gpupool/queue"), data


def _routes(db: _Db, route: Callable[[Any], EventRoute], applied: list[str]) -> Routes:
    async def handler(event: CloudEvent, data: JobSubmitted) -> None:
        applied.append(data.job_id)
        async with UnitOfWork(db, "/gpupool/test") as uow:  # type: ignore[arg-type]
            uow.conn.effects.append(data.job_id)

    return Routes(inbox="svc", events={JobSubmitted: route(handler)})


async def test_an_applied_once_route_skips_a_redelivered_event_without_running_the_handler_body() -> None:
    db = _Db()
    applied: list[str] = []
    table = _routes(db, once, applied)
    event, data = _event("j-1")
    await table.dispatch(event, data)
    await table.dispatch(event, data)  # redelivered: the inbox holds it
    assert applied == ["j-1", "j-1"]  # the handler was called both times...
    assert db.effects == ["j-1"]  # ...and its unit of work applied it once
    assert db.inbox == {("svc", event.id)}
    assert (db.commits, db.rollbacks) == (1, 1)  # the duplicate's transaction rolled back at once
    other, other_data = _event("j-2")
    await table.dispatch(other, other_data)
    assert db.effects == ["j-1", "j-2"]


async def test_an_idempotent_route_records_nothing_in_the_inbox() -> None:
    db = _Db()
    applied: list[str] = []
    table = _routes(db, lambda h: idempotent(h, "test: applying twice is harmless"), applied)
    event, data = _event("j-1")
    await table.dispatch(event, data)
    await table.dispatch(event, data)
    assert db.effects == ["j-1", "j-1"] and db.inbox == set()


async def test_a_unit_of_work_outside_an_applied_once_route_records_nothing() -> None:
    db = _Db()
    async with UnitOfWork(db, "/gpupool/test") as uow:  # type: ignore[arg-type]
        uow.conn.effects.append("command")
    assert db.effects == ["command"] and db.inbox == set()


async def test_only_the_first_unit_of_work_of_the_handler_records_the_event() -> None:
    db = _Db()

    async def two_steps(event: CloudEvent, data: JobSubmitted) -> None:
        for step in ("a", "b"):
            async with UnitOfWork(db, "/gpupool/test") as uow:  # type: ignore[arg-type]
                uow.conn.effects.append(step)

    table = Routes(inbox="svc", events={JobSubmitted: once(two_steps)})
    event, data = _event("j-1")
    await table.dispatch(event, data)
    assert db.effects == ["a", "b"] and db.inbox == {("svc", event.id)}
    await table.dispatch(event, data)  # the first step finds the inbox row: nothing after it runs
    assert db.effects == ["a", "b"]


async def test_a_failed_first_unit_of_work_leaves_the_event_to_the_next_one() -> None:
    """Its inbox row rolled back with it: a later unit of work of the same handler records the event."""
    db = _Db()

    async def retries(event: CloudEvent, data: JobSubmitted) -> None:
        with pytest.raises(RuntimeError):
            async with UnitOfWork(db, "/gpupool/test"):  # type: ignore[arg-type]
                raise RuntimeError("conflict")
        async with UnitOfWork(db, "/gpupool/test") as uow:  # type: ignore[arg-type]
            uow.conn.effects.append("retried")

    table = Routes(inbox="svc", events={JobSubmitted: once(retries)})
    event, data = _event("j-1")
    await table.dispatch(event, data)
    assert db.effects == ["retried"] and db.inbox == {("svc", event.id)}
