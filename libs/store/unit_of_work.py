"""Unit of work: one transaction that holds a state change, the events it emits (outbox) and, for consumers,
the inbox row that makes handling an event idempotent. Either all of it commits or none of it does.

Batched consumers: a consumer that applies a fetched batch of messages opens a `BatchTransaction`; every unit of
work started in that task on the same pool then runs as a savepoint of the batch's transaction, so a failing
message rolls back only its own effects and the batch pays one commit (one WAL flush) instead of one per message.
Whatever must wait for durability (waking the outbox relay, work that reads what was committed or calls other
services) runs after the batch's real commit.

Inbox: a consumer applies an event at most once by running its handler under `apply_once(consumer, event id, ...)`
(libs.runtime.routes does, for every route declared applied once). The first unit of work the handler opens in that
task then records (consumer, event id) in the inbox as its first statement, in its own transaction (or savepoint),
so the inbox row commits or rolls back with the handler's state change and outbox rows. If the inbox already holds
the event, that unit of work rolls back at once and raises `AlreadyApplied` instead of running the handler's body;
`apply_once` takes it as done (the consumer acks). A handler that returns before opening a unit of work (nothing to
apply) records nothing, as it changes nothing.

Without savepoints: libs.bus.consumer first applies a batch with `optimistic` set, where units of work run straight
in the batch's transaction (no SAVEPOINT and RELEASE per message). A unit of work that fails then `spoils` the
batch: the consumer rolls it all back and applies it again with savepoints, so a failure still rolls back alone.

Inbox of a batch: a batched consumer names the event ids of its fetched messages (`BatchTransaction.expect_events`,
their `Nats-Msg-Id`, which the relay sets to the event id). The first applied-once event of the batch then records
all of them in the inbox in one statement, in the batch's transaction before any savepoint, and learns which the
inbox held already; each event's first unit of work takes its answer from there instead of a statement of its own
(an event held already: AlreadyApplied, before its savepoint). Rows of events that end up not recorded (their unit of
work rolled back, their handler opened none, the message was refused) are deleted in one statement before the
batch commits, so the inbox ends as if each event had recorded its own row. An event whose id the batch was not told
records its row itself, as above.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from types import TracebackType

import asyncpg
from asyncpg.transaction import Transaction

from libs.contracts.envelope import CloudEvent
from libs.contracts.events import EventData, subject_for
from libs.observability.tracing import current_traceparent

log = logging.getLogger(__name__)

AfterCommit = Callable[[], Awaitable[object]]
OutboxRow = tuple[str, str, bytes, str | None]  # event id, subject, payload, traceparent


def outbox_cte(first: int) -> str:
    """A data-modifying CTE body inserting outbox rows, in order, from four array parameters starting at `$first`
    (`outbox_args`): a store function adds `o AS (...)` to its statement for a unit of work's `take_outbox()`."""
    return f"""INSERT INTO outbox (event_id, subject, payload, traceparent)
               SELECT e, s, p, t FROM unnest(${first}::text[], ${first + 1}::text[], ${first + 2}::bytea[],
                                             ${first + 3}::text[]) WITH ORDINALITY AS r(e, s, p, t, n) ORDER BY n"""


def outbox_args(rows: list[OutboxRow]) -> list[list]:  # type: ignore[type-arg]
    return [[r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows], [r[3] for r in rows]]

_batch: contextvars.ContextVar[BatchTransaction | None] = contextvars.ContextVar("gpupool_batch_tx", default=None)
_SAVEPOINT = "gpupool_uow"


class AlreadyApplied(Exception):
    """Raised on entering the unit of work that was to record an event the inbox already holds: the handler's
    body does not run, and `apply_once` reports the event as applied (the consumer acks it)."""

    def __init__(self, consumer: str, event_id: str) -> None:
        super().__init__(f"{consumer} already applied event {event_id}")
        self.consumer = consumer
        self.event_id = event_id


@dataclass(slots=True)
class _InboxClaim:
    """The event a handler is applying under `apply_once`, waiting for its first unit of work to record it."""
    consumer: str
    event_id: str
    task: asyncio.Task[object] | None
    recorded: bool = False


_claim: contextvars.ContextVar[_InboxClaim | None] = contextvars.ContextVar("gpupool_inbox_claim", default=None)


async def apply_once(consumer: str, event_id: str, handle: Callable[[], Awaitable[object]]) -> bool:
    """Run `handle` so that the first unit of work it opens (in this task) records (consumer, event_id) in the
    inbox before anything else, in the same transaction as the handler's effects. False: the inbox already held
    the event, so the handler stopped at that unit of work and nothing was applied again."""
    claim = _InboxClaim(consumer, event_id, asyncio.current_task())
    token = _claim.set(claim)
    try:
        await handle()
    except AlreadyApplied as exc:
        if (exc.consumer, exc.event_id) != (consumer, event_id):
            raise
        return False
    finally:
        _claim.reset(token)
    return True


def pending_claim() -> _InboxClaim | None:
    """The event this task applies under `apply_once` and has not recorded yet: what the next unit of work it opens
    records first (libs.runtime.fake's unit of work honours the same claim)."""
    claim = _claim.get()
    if claim is None or claim.recorded or claim.task is not asyncio.current_task():
        return None  # none, recorded already, or a task the handler spawned (it inherits the context variable)
    return claim


async def begin(pool: asyncpg.Pool) -> tuple[asyncpg.Connection, Transaction]:
    """A connection from the pool with a transaction started on it (the connection goes back if BEGIN fails)."""
    conn = await pool.acquire()
    try:
        tx = conn.transaction()
        await tx.start()
    except BaseException:
        await pool.release(conn)
        raise
    return conn, tx


async def end(pool: asyncpg.Pool, conn: asyncpg.Connection, tx: Transaction, *, commit: bool) -> None:
    """Commit (or roll back) what `begin` started, and give the connection back whatever happens."""
    try:
        if commit:
            await tx.commit()
        else:
            await tx.rollback()
    finally:
        await pool.release(conn)


@dataclass(slots=True)
class _BatchInbox:
    """One inbox consumer's rows for a batch: recorded up front (`fresh`: new now; the rest were held already)."""
    fresh: set[str]
    claimed: set[str]


class BatchTransaction:
    """One database transaction around the handling of a batch of consumed messages (see the module docstring).

    Entered by the consumer's task only; the connection it holds is used by that task's units of work and never
    by another task (a task a handler spawns inherits the context variable but not the right to the connection).
    On exit: commit (or roll back on an exception), release the connection, then run what units of work deferred
    to after the commit. An exception from the commit propagates: the consumer then acknowledges nothing."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self.pool = pool
        self.conn: asyncpg.Connection
        self._on_commit: list[Callable[[], None]] = []
        self._after_commit: list[AfterCommit] = []
        self._task: asyncio.Task[object] | None = None
        self._open = False
        # Savepoints of units of work that succeeded and are not released yet: releasing one costs a round trip,
        # so it rides along with the next savepoint's creation (or the commit, which releases everything).
        self._unreleased = 0
        self._expected: frozenset[str] = frozenset()  # the batch's event ids (expect_events)
        self._inbox: dict[str, _BatchInbox] = {}  # per inbox consumer, once its first event of the batch came
        # Without savepoints (set before entering; libs.bus.consumer's first try at a batch): units of work run
        # straight in the batch's transaction, and one that fails spoils it (the consumer rolls the batch back and
        # applies it again with savepoints)
        self.optimistic = False
        self.spoiled = False

    async def __aenter__(self) -> BatchTransaction:
        self.conn, self._tx = await begin(self.pool)
        self._task = asyncio.current_task()
        self._open = True
        self._token = _batch.set(self)
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        self._open = False
        _batch.reset(self._token)
        if exc_type is None:
            try:
                await self._forget_unclaimed()
            except BaseException as forget_exc:
                await end(self.pool, self.conn, self._tx, commit=False)
                raise forget_exc
        await end(self.pool, self.conn, self._tx, commit=exc_type is None)
        if exc_type is not None:
            return
        for callback in dict.fromkeys(self._on_commit):  # one relay wake per batch, not one per message
            callback()
        for work in self._after_commit:
            await _run_after_commit(work)

    def expect_events(self, event_ids: list[str | None]) -> None:
        """The event ids of the batch's messages, as their publisher named them (Nats-Msg-Id): recorded in the
        inbox together by the batch's first applied-once event (see the module docstring)."""
        self._expected = frozenset(i for i in event_ids if i)

    async def claim(self, consumer: str, event_id: str) -> bool | None:
        """Record `event_id` for `consumer` from the batch's inbox rows. None: not one of the batch's expected
        events (the unit of work records it itself); True: first time; False: applied already (or earlier in this
        batch). Runs outside any open unit of work's savepoint, so the batch's rows roll back only with it."""
        if event_id not in self._expected or len(self._expected) < 2:
            return None
        inbox = self._inbox.get(consumer)
        if inbox is None:
            # no unit of work is open here (this is a handler's first): the rows land in the batch's own
            # transaction (or in finished units of work's savepoints, which are only ever released)
            rows = await self.conn.fetch(
                """INSERT INTO inbox (consumer, event_id) SELECT $1, e FROM unnest($2::text[]) AS e ORDER BY e
                   ON CONFLICT DO NOTHING RETURNING event_id""", consumer, sorted(self._expected))
            inbox = self._inbox[consumer] = _BatchInbox({r["event_id"] for r in rows}, set())
        if event_id not in inbox.fresh or event_id in inbox.claimed:
            return False
        inbox.claimed.add(event_id)
        return True

    def unclaim(self, consumer: str, event_id: str) -> None:
        """The unit of work that claimed `event_id` rolled back: its inbox row goes unless a later one claims it."""
        self._inbox[consumer].claimed.discard(event_id)

    async def _forget_unclaimed(self) -> None:
        for consumer, inbox in self._inbox.items():
            unclaimed = sorted(inbox.fresh - inbox.claimed)
            if unclaimed:
                await self.conn.execute("DELETE FROM inbox WHERE consumer = $1 AND event_id = ANY($2::text[])",
                                        consumer, unclaimed)

    async def savepoint(self) -> None:
        if self.optimistic:
            return
        await self.conn.execute(f"RELEASE SAVEPOINT {_SAVEPOINT}; " * self._unreleased + f"SAVEPOINT {_SAVEPOINT}")
        self._unreleased = 0

    def savepoint_done(self) -> None:
        if not self.optimistic:
            self._unreleased += 1

    async def rollback_to_savepoint(self, *, wrote: bool = True) -> None:
        """Undo the innermost open unit of work. Unreleased savepoints at this point are of units of work nested
        in it (a sibling's were released when this one began): release them first so the name means this one.
        Without savepoints there is nothing to roll back to: the batch is spoiled, unless the unit of work wrote
        nothing (`wrote` False: its event was applied already)."""
        if self.optimistic:
            self.spoiled = self.spoiled or wrote
            return
        await self.conn.execute(f"RELEASE SAVEPOINT {_SAVEPOINT}; " * self._unreleased +
                                f"ROLLBACK TO SAVEPOINT {_SAVEPOINT}; RELEASE SAVEPOINT {_SAVEPOINT}")
        self._unreleased = 0

    def serves(self, pool: asyncpg.Pool) -> bool:
        """Whether a unit of work on `pool` started now belongs to this batch."""
        return self._open and pool is self.pool and asyncio.current_task() is self._task


def current_batch(pool: asyncpg.Pool) -> BatchTransaction | None:
    batch = _batch.get()
    return batch if batch is not None and batch.serves(pool) else None


async def _run_after_commit(work: AfterCommit) -> None:
    # The state change is durable already; a failure here is the follow-up's (its own retry path covers it).
    try:
        await work()
    except Exception:
        log.exception("after_commit_failed")


class UnitOfWork:
    def __init__(self, pool: asyncpg.Pool, source: str, on_commit: Callable[[], None] | None = None) -> None:
        self._pool = pool
        self._source = source
        self._on_commit = on_commit
        self._emitted: list[CloudEvent] = []
        self._unwritten: list[OutboxRow] = []  # outbox rows not yet inserted
        self._after_commit: list[AfterCommit] = []
        self._batch: BatchTransaction | None = None
        self._claim: _InboxClaim | None = None  # the event this unit of work recorded in the inbox (apply_once)
        self._batch_claimed = False  # ... from the batch's inbox rows
        self.conn: asyncpg.Connection

    async def __aenter__(self) -> UnitOfWork:
        self._batch = current_batch(self._pool)
        claim = pending_claim()
        if self._batch is not None:
            claimed = await self._batch.claim(claim.consumer, claim.event_id) if claim is not None else None
            if claim is not None and claimed is False:
                raise AlreadyApplied(claim.consumer, claim.event_id)  # before its savepoint: nothing to undo
            self.conn = self._batch.conn
            try:
                await self._batch.savepoint()  # a SAVEPOINT of the batch's transaction
            except BaseException:
                if claim is not None and claimed:
                    self._batch.unclaim(claim.consumer, claim.event_id)
                raise
            if claim is not None and claimed:
                claim.recorded, self._claim, self._batch_claimed = True, claim, True
                return self
        else:
            self.conn, self._tx = await begin(self._pool)
        if claim is not None:
            await self._record(claim)
        return self

    async def _record(self, claim: _InboxClaim) -> None:
        """The inbox row of the event being applied, first in this transaction; roll back and raise
        AlreadyApplied when the inbox already holds it (the handler's body then does not run)."""
        try:
            first = await self.first_time(claim.consumer, claim.event_id)
        except BaseException as exc:
            await self.__aexit__(type(exc), exc, exc.__traceback__)
            raise
        if not first:
            skipped = AlreadyApplied(claim.consumer, claim.event_id)
            await self.__aexit__(AlreadyApplied, skipped, None)
            raise skipped
        claim.recorded = True
        self._claim = claim

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        if exc_type is not None and self._claim is not None:
            self._claim.recorded = False  # its inbox row rolls back too: a later unit of work of the handler records it
            if self._batch_claimed and self._batch is not None:
                self._batch.unclaim(self._claim.consumer, self._claim.event_id)
            self._claim, self._batch_claimed = None, False
        if exc_type is None and self._unwritten:
            try:
                await self._write_outbox()
            except BaseException as write_exc:
                await self.__aexit__(type(write_exc), write_exc, write_exc.__traceback__)
                raise
        if self._batch is not None:
            if exc_type is None:
                self._batch.savepoint_done()  # durable only with the batch's commit
                if self._emitted and self._on_commit is not None:
                    self._batch._on_commit.append(self._on_commit)
                self._batch._after_commit.extend(self._after_commit)
            else:
                # the batch's other messages stay; an event the inbox held already wrote nothing to undo
                await self._batch.rollback_to_savepoint(wrote=exc_type is not AlreadyApplied)
            return
        await end(self._pool, self.conn, self._tx, commit=exc_type is None)
        if exc_type is None:
            if self._emitted and self._on_commit is not None:
                self._on_commit()
            for work in self._after_commit:
                await _run_after_commit(work)

    @property
    def emitted(self) -> list[CloudEvent]:
        return list(self._emitted)

    @property
    def batched(self) -> bool:
        """True when this unit of work is a savepoint of a consumer's batch transaction."""
        return self._batch is not None

    def after_commit(self, work: AfterCommit) -> None:
        """Run `work` once this unit of work is durable: right after its commit, or, inside a batch, after the
        batch's commit. Use it for follow-ups that read committed state through another connection or call other
        services (inside a batch those would not see this change yet, or would hold the batch's locks meanwhile).
        Nothing runs if the unit of work rolls back; a failing follow-up is logged, not raised."""
        self._after_commit.append(work)

    async def emit(self, data: EventData) -> CloudEvent:
        """Put the event into the outbox inside this transaction; the relay publishes it after commit. The rows
        are inserted together when the unit of work ends, in emit order (one statement, not one per event)."""
        traceparent = current_traceparent()
        event = data.to_cloudevent(self._source, traceparent=traceparent)
        self._unwritten.append((event.id, subject_for(data), event.to_json(), traceparent))
        self._emitted.append(event)
        return event

    def take_outbox(self) -> list[OutboxRow]:
        """The events emitted so far and not written yet, handed to the caller's next statement to insert with its
        own change (`outbox_cte`): the change and its events in one round trip. The caller must run that statement
        in this unit of work; what is emitted after it is written at the end, as usual (in emit order: the outbox's
        `seq` follows the inserts)."""
        rows, self._unwritten = self._unwritten, []
        return rows

    async def _write_outbox(self) -> None:
        rows, self._unwritten = self._unwritten, []
        if len(rows) == 1:
            await self.conn.execute(
                "INSERT INTO outbox (event_id, subject, payload, traceparent) VALUES ($1, $2, $3, $4)", *rows[0])
            return
        # WITH ORDINALITY: seq follows emit order, which is the order the relay publishes in
        await self.conn.execute(outbox_cte(1), *outbox_args(rows))

    async def first_time(self, consumer: str, event_id: str) -> bool:
        """Record (consumer, event id) in the inbox. False means this event was already applied: skip it.
        Event handlers do not call this: their routes declare them applied once (see `apply_once`)."""
        inserted = await self.conn.fetchval(
            "INSERT INTO inbox (consumer, event_id) VALUES ($1, $2) ON CONFLICT DO NOTHING RETURNING 1",
            consumer, event_id)
        return inserted is not None
