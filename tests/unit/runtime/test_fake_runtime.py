"""The fake runtime (libs/runtime/fake.py) keeps the promises handler unit tests rely on: a unit of work commits its
events with its changes or neither, an event routed once is applied once (and again after a rollback), requests go
through the real request/reply code (validation 400, failure 500, nobody serving: ServiceUnavailable), and a store
function that is not faked fails loudly instead of passing silently."""

from __future__ import annotations

from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

import pytest

from libs.bus.rpc import ServiceUnavailable
from libs.contracts.commands import JobRef
from libs.contracts.envelope import CloudEvent
from libs.contracts.events import JobCancelled, TeamCreated
from libs.runtime.fake import FakeRuntime, FakeStore, subject_matches
from libs.runtime.routes import Routes, once

NOW = datetime(2026, 1, 1, tzinfo=UTC)


class Teams(FakeStore):
    def __init__(self) -> None:
        super().__init__(SimpleNamespace(pure=lambda: "from the real module",
                                         sql=lambda conn: conn.fetchval("SELECT 1")))
        self.names: list[str] = []


def cancelled(job_id: str = "j1") -> JobCancelled:
    return JobCancelled(job_id=job_id, team="t", reason="r", cancelled_at=NOW)


async def test_a_unit_of_work_commits_its_events_with_its_changes_or_neither() -> None:
    teams = Teams()
    rt = FakeRuntime("quota", stores=(teams,))
    async with rt.uow() as uow:
        teams.names.append("a")
        await uow.emit(TeamCreated(team="a", org="o", revision=1, created_at=NOW))
    with pytest.raises(RuntimeError):
        async with rt.uow() as uow:
            teams.names.append("b")
            await uow.emit(TeamCreated(team="b", org="o", revision=2, created_at=NOW))
            raise RuntimeError("boom")
    assert teams.names == ["a"] and [e.team for e in rt.emitted()] == ["a"]
    assert (rt.commits, rt.rollbacks) == (1, 1) and rt.outbox[0].subject.endswith("team_created")


async def test_an_event_routed_once_is_applied_once_and_again_after_its_rollback() -> None:
    teams = Teams()
    rt = FakeRuntime("quota", stores=(teams,))
    failing = [True]

    async def handler(event: CloudEvent, data: JobCancelled) -> None:
        async with rt.uow():
            teams.names.append(data.job_id)
            if failing[0]:
                raise RuntimeError("transient")
    await rt.mount(Routes(inbox="quota", events={JobCancelled: once(handler)}))
    event = cancelled().to_cloudevent("/gpupool/queue")
    for _ in range(2):  # each failed delivery rolls back its inbox row with its changes
        with pytest.raises(RuntimeError):
            await rt.deliver(cancelled(), event=event)
    assert teams.names == [] and rt.inbox == set()
    failing[0] = False
    await rt.deliver(cancelled(), event=event)
    await rt.deliver(cancelled(), event=event)
    assert teams.names == ["j1"] and rt.inbox == {("quota", event.id)}


async def test_requests_go_through_validation_and_failures_and_need_someone_serving() -> None:
    rt = FakeRuntime("queue")

    async def get_job(cmd: JobRef) -> Any:
        if cmd.job_id == "boom":
            raise RuntimeError("internal detail")
        return {"job_id": cmd.job_id}
    await rt.serve("gpupool.query.queue.get_job", JobRef, get_job)
    assert (await rt.request("gpupool.query.queue.get_job", JobRef(job_id="j1"))).result == {"job_id": "j1"}
    invalid = await rt.request("gpupool.query.queue.get_job", {"job_id": ""})
    failed = await rt.request("gpupool.query.queue.get_job", JobRef(job_id="boom"))
    assert invalid.error is not None and (invalid.error.status, invalid.error.reason) == (400, "InvalidRequest")
    assert failed.error is not None and failed.error.status == 500 and "internal" not in failed.error.message
    with pytest.raises(ServiceUnavailable):
        await rt.request("gpupool.query.nobody.there", JobRef(job_id="j1"))


async def test_a_store_function_that_is_not_faked_fails_on_the_fake_connection() -> None:
    teams = Teams()
    rt = FakeRuntime("quota", stores=(teams,))
    assert teams.pure() == "from the real module"
    with pytest.raises(AssertionError, match="not faked used the database connection"):
        async with rt.uow() as uow:
            await teams.sql(uow.conn)


def test_subjects_match_as_nats_matches_them() -> None:
    assert subject_matches("a.*.c", "a.b.c") and not subject_matches("a.*.c", "a.b.d")
    assert subject_matches("a.>", "a.b.c") and not subject_matches("a.>", "a")
    assert not subject_matches("a.b", "a.b.c") and not subject_matches("a.b.c", "a.b")
