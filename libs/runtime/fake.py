"""A fake `ServiceRuntime` for handler unit tests: no NATS, no PostgreSQL, the service's real handlers and routing
table. For tests only: no service imports it (.importlinter, "services never import the fake runtime").

What it keeps faithful, and how:
- Units of work: `rt.uow()` gives a `FakeUnitOfWork`. Its events go to `rt.outbox` only when it ends without an
  exception, with what the fake stores changed; an exception restores the fake stores and the inbox to where they
  were when it began (its snapshot), as a rolled-back transaction would, and its events are dropped.
- The inbox: the routing table's dispatch is the real one (`Routes.dispatch` → `apply_once`); the fake unit of work
  honours the same inbox claim as the real one (libs.store.unit_of_work), so an event routed `once(...)` and
  delivered twice is applied once, and a handler that opens no unit of work records nothing.
- Request/reply: `rt.mount(routes)` serves the table's commands with the real `libs.bus.rpc.serve` on `FakeNats`, and
  `rt.request(subject, cmd)` asks with the real `libs.bus.rpc.request`: the command goes through JSON and its
  model's validation (bad input is a 400 `InvalidRequest`), a failing handler is a 500, as on the bus. A handler's
  own requests to other services are answered by what a test serves (`await rt.serve(subject, Model, answer)`);
  nothing served on a subject is `ServiceUnavailable`, as a request with no responder is.
- Stores: a handler reaches SQL only through its service's store module. A test swaps that module for a
  `FakeStore` subclass (in-memory rows, the same function names and arguments as the store functions the handler
  calls; cosmicpython's FakeRepository). What the subclass does not define comes from the real module (its pure
  helpers); a real SQL function reached that way fails on `FakeConnection`, naming what to fake.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from types import ModuleType, TracebackType
from typing import Any

from libs.bus.rpc import ServiceUnavailable, request, serve
from libs.contracts.commands import Command, Reply
from libs.contracts.envelope import CloudEvent
from libs.contracts.events import EventData, subject_for
from libs.runtime.routes import Routes
from libs.store.unit_of_work import AlreadyApplied, pending_claim

log = logging.getLogger(__name__)


class FakeConnection:
    """The connection handlers hand to their store: fake store functions ignore it, a real one reaching it fails.
    `transaction()` (a handler's own transaction or savepoint) restores the fake stores if its block raises."""

    def __init__(self, rt: FakeRuntime) -> None:
        self._rt = rt

    @contextlib.asynccontextmanager
    async def transaction(self) -> Any:
        snapshot = self._rt._snapshot()
        try:
            yield self
        except BaseException:
            self._rt._restore(snapshot)
            raise

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"a store function that is not faked used the database connection (.{name}): "
                             "give the test's FakeStore that function")


class FakePool:
    def __init__(self, conn: FakeConnection) -> None:
        self.conn = conn

    @contextlib.asynccontextmanager
    async def acquire(self) -> Any:
        yield self.conn


class FakeStore:
    """Base of a service's in-memory store for tests. Public instance attributes are its tables: units of work
    snapshot and restore them. Attributes it does not define come from the real store module (`real`)."""

    def __init__(self, real: ModuleType) -> None:
        self._real = real

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    def _snapshot(self) -> dict[str, Any]:
        return {k: copy.deepcopy(v) for k, v in vars(self).items() if not k.startswith("_")}

    def _restore(self, snapshot: dict[str, Any]) -> None:
        vars(self).update(snapshot)


@dataclass(frozen=True, slots=True)
class Emitted:
    """An event a committed unit of work put into the outbox."""
    subject: str
    event: CloudEvent
    data: EventData


class FakeUnitOfWork:
    def __init__(self, rt: FakeRuntime) -> None:
        self._rt = rt
        self.conn = rt.conn
        self._emitted: list[Emitted] = []
        self._after_commit: list[Callable[[], Awaitable[object]]] = []
        self._claim: Any = None

    async def __aenter__(self) -> FakeUnitOfWork:
        self._snapshot = self._rt._snapshot()
        claim = pending_claim()
        if claim is not None:
            key = (claim.consumer, claim.event_id)
            if key in self._rt.inbox:
                raise AlreadyApplied(*key)  # the real one rolls back here: nothing changed yet
            self._rt.inbox.add(key)
            claim.recorded = True
            self._claim = claim
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        if exc_type is not None:
            self._rt._restore(self._snapshot)
            if self._claim is not None:
                self._claim.recorded = False
            self._rt.rollbacks += 1
            return
        self._rt.outbox.extend(self._emitted)
        self._rt.commits += 1
        for work in self._after_commit:
            try:
                await work()
            except Exception:  # as the real one: the change is durable, the follow-up's failure is logged
                log.exception("after_commit_failed")

    @property
    def emitted(self) -> list[CloudEvent]:
        return [e.event for e in self._emitted]

    @property
    def batched(self) -> bool:
        return False

    def after_commit(self, work: Callable[[], Awaitable[object]]) -> None:
        self._after_commit.append(work)

    def take_outbox(self) -> list[Any]:
        """Nothing to hand over: the fake stores write no outbox rows; emitted events reach `rt.outbox` at the end."""
        return []

    async def emit(self, data: EventData) -> CloudEvent:
        event = data.to_cloudevent(self._rt.source)
        self._emitted.append(Emitted(subject_for(data), event, data))
        return event


@dataclass
class _FakeMsg:
    subject: str
    data: bytes
    reply: str = "_INBOX.fake"
    headers: dict[str, str] | None = None
    answer: asyncio.Future[bytes] | None = None

    async def respond(self, payload: bytes) -> None:
        assert self.answer is not None
        self.answer.set_result(payload)


def subject_matches(pattern: str, subject: str) -> bool:
    """NATS subject matching: `*` is one token, `>` the rest."""
    want, have = pattern.split("."), subject.split(".")
    for i, token in enumerate(want):
        if token == ">":
            return len(have) > i
        if i >= len(have) or (token != "*" and token != have[i]):
            return False
    return len(want) == len(have)


@dataclass
class _Ack:
    stream: str
    seq: int
    duplicate: bool = False


@dataclass(eq=False)
class FakeJetStream:
    """JetStream publishes, stored in order (`published`: subject, payload, headers); `down` refuses them, as a
    JetStream that stores nothing does."""
    published: list[tuple[str, bytes, dict[str, str]]] = field(default_factory=list)
    down: bool = False

    async def publish(self, subject: str, payload: bytes = b"", timeout: float | None = None,
                      stream: str | None = None, headers: dict[str, str] | None = None) -> _Ack:
        if self.down:
            raise ConnectionError("JetStream is not answering")
        self.published.append((subject, payload, dict(headers or {})))
        return _Ack(stream=stream or "FAKE", seq=len(self.published))


@dataclass(eq=False)  # hashable by identity, as a client is (services key per-connection state on it)
class FakeNats:
    """Core NATS in process: request/reply to what is subscribed, publishes delivered to subscribers and kept in
    `published` (subject, payload); `jetstream()` gives its FakeJetStream."""
    subscriptions: list[tuple[str, Callable[[Any], Awaitable[None]]]] = field(default_factory=list)
    published: list[tuple[str, bytes]] = field(default_factory=list)
    requests: list[tuple[str, bytes]] = field(default_factory=list)
    js: FakeJetStream = field(default_factory=FakeJetStream)
    is_connected: bool = True

    def jetstream(self) -> FakeJetStream:
        return self.js

    async def subscribe(self, subject: str, queue: str = "", cb: Any = None) -> Any:
        entry = (subject, cb)
        self.subscriptions.append(entry)
        nc = self

        class _Sub:
            async def unsubscribe(self) -> None:
                nc.subscriptions.remove(entry)
        return _Sub()

    async def request(self, subject: str, payload: bytes, timeout: float = 5.0,
                      headers: dict[str, str] | None = None) -> _FakeMsg:
        self.requests.append((subject, payload))
        for pattern, cb in reversed(self.subscriptions):
            if subject_matches(pattern, subject):
                answer: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
                await cb(_FakeMsg(subject, payload, headers=headers or {}, answer=answer))
                return _FakeMsg(subject, await asyncio.wait_for(answer, timeout))
        raise ServiceUnavailable(f"no reply on {subject}: NoRespondersError")

    async def publish(self, subject: str, payload: bytes = b"", headers: dict[str, str] | None = None) -> None:
        """Kept, and handed to every subscriber of a matching subject (awaited: a test sees its effect at once)."""
        self.published.append((subject, payload))
        for pattern, cb in list(self.subscriptions):
            if subject_matches(pattern, subject):
                await cb(_FakeMsg(subject, payload, reply="", headers=headers or {}))


class FakeRuntime:
    """Stands in for `libs.runtime.service.ServiceRuntime` in handler unit tests (see the module docstring)."""

    def __init__(self, name: str, *, stores: tuple[FakeStore, ...] = (), settings: Any = None) -> None:
        self.name = name
        self.settings = settings
        self.instance = f"{name}-fake"
        self.source = f"/gpupool/{name}"
        self.stores = stores
        self.conn = FakeConnection(self)
        self.pool = FakePool(self.conn)
        self.nc = FakeNats()
        self.js = self.nc.js
        self.inbox: set[tuple[str, str]] = set()  # (consumer, event id), as the inbox table
        self.outbox: list[Emitted] = []  # what committed units of work emitted, in order
        self.commits = 0
        self.rollbacks = 0
        self.routes: Routes | None = None
        self.background_tasks: list[tuple[str, Awaitable[Any]]] = []

    # --- what handlers use ------------------------------------------------------------------------------------
    def uow(self) -> FakeUnitOfWork:
        return FakeUnitOfWork(self)

    def background(self, coro: Awaitable[Any], name: str) -> None:
        """Recorded, not run: a test runs a service's periodic step itself."""
        if asyncio.iscoroutine(coro):
            coro.close()
        self.background_tasks.append((name, coro))

    def on_shutdown(self, hook: Callable[[], Awaitable[None]]) -> None:
        pass

    async def serve(self, subject: str, command: type[Command], handler: Callable[[Any], Awaitable[Any]],
                    subject_check: Callable[[str, Any], str | None] | None = None) -> None:
        await serve(self.nc, subject, command, handler, queue=self.name,  # type: ignore[arg-type]
                    subject_check=subject_check)

    async def mount(self, routes: Routes) -> None:
        for subject, (command, handler) in routes.commands.items():
            await self.serve(subject, command, handler, routes.subject_checks.get(subject))
        self.routes = routes

    # --- what tests use ---------------------------------------------------------------------------------------
    async def request(self, subject: str, cmd: Command | dict[str, Any], *, timeout: float = 5.0) -> Reply:
        """Ask `subject` as a caller on the bus would (a dict is sent as it is: bad input reaches validation)."""
        if isinstance(cmd, dict):
            return await request(self.nc, subject, _Raw(cmd), timeout=timeout)  # type: ignore[arg-type]
        return await request(self.nc, subject, cmd, timeout=timeout)  # type: ignore[arg-type]

    async def deliver(self, data: EventData, *, event: CloudEvent | None = None, source: str = "/gpupool/test") \
            -> CloudEvent:
        """Hand an event to the mounted routing table as the consumer would; returns the envelope, so a test can
        deliver the very same event (same id) again."""
        assert self.routes is not None, "mount the routing table first"
        event = event if event is not None else data.to_cloudevent(source)
        await self.routes.dispatch(event, data)
        return event

    async def deliver_telemetry(self, data: EventData, *, event: CloudEvent | None = None) -> CloudEvent:
        assert self.routes is not None, "mount the routing table first"
        event = event if event is not None else data.to_cloudevent("/gpupool/agent")
        await self.routes.dispatch_telemetry(event, data)
        return event

    def emitted(self, *types: type[EventData]) -> list[Any]:
        """The committed events' data, in order; only those of `types` when given."""
        return [e.data for e in self.outbox if not types or isinstance(e.data, types)]

    def take_emitted(self) -> list[Any]:
        """The committed events so far, forgetting them (to assert on what the next step emits alone)."""
        out, self.outbox = [e.data for e in self.outbox], []
        return out

    # --- snapshots for rollback ---------------------------------------------------------------------------------
    def _snapshot(self) -> tuple[list[dict[str, Any]], set[tuple[str, str]]]:
        return [s._snapshot() for s in self.stores], set(self.inbox)

    def _restore(self, snapshot: tuple[list[dict[str, Any]], set[tuple[str, str]]]) -> None:
        stores, inbox = snapshot
        for store, tables in zip(self.stores, stores, strict=True):
            store._restore(tables)
        self.inbox = inbox


class _Raw:
    """A request body sent as given, for tests of what validation refuses."""

    def __init__(self, doc: dict[str, Any]) -> None:
        self.doc = doc

    def model_dump_json(self) -> str:
        import json
        return json.dumps(self.doc)
