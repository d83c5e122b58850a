"""GET /v1/jobs/{id}/logs: the pure text rules (attempt and replica choice, tail, prefixes, whole lines), and the
route against a fake bus (queue, placement, node agents): scoping, problem bodies, plain reads and following."""

from __future__ import annotations

from typing import Any

import pytest
from gateway_fakes import FakeBus, allocation, app, bus, client, job_view  # noqa: F401  (fixtures)

from services.gateway import logs
from services.gateway.logs import choose_allocations, prefix_lines, replica_prefix, tail_lines, whole_lines


# --- pure pieces ----------------------------------------------------------------------------------------------------
def test_the_latest_attempt_is_shown_unless_one_is_asked_for() -> None:
    allocs = [allocation("a0", attempt=0), allocation("a1", attempt=1), allocation("a2", attempt=1, replica=1)]
    attempt, chosen = choose_allocations(allocs)
    assert attempt == 1 and [a["allocation_id"] for a in chosen] == ["a1", "a2"]
    assert choose_allocations(allocs, attempt=0) == (0, [allocs[0]])
    assert choose_allocations(allocs, replica=1) == (1, [allocs[2]])
    assert choose_allocations(allocs, attempt=5) == (5, [])
    assert choose_allocations([]) == (None, [])


def test_allocations_without_an_attempt_count_as_attempt_zero_and_the_latest_grant_wins() -> None:
    old = allocation("old", granted_at="2026-01-01T10:00:00+00:00")
    new = allocation("new", granted_at="2026-01-01T11:00:00+00:00")
    other = allocation("r1", replica=1, granted_at="2026-01-01T09:00:00+00:00")
    attempt, chosen = choose_allocations([new, other, old])
    assert attempt == 0 and [a["allocation_id"] for a in chosen] == ["new", "r1"]


def test_tail_keeps_the_last_lines_and_drops_a_cut_first_line() -> None:
    text = "one\ntwo\nthree\nfour"
    assert tail_lines(text, 2, whole=True) == "three\nfour"
    assert tail_lines(text, 10, whole=True) == text
    assert tail_lines("ne\ntwo\n", 5, whole=False) == "two\n"  # "ne" is what the byte tail left of a line
    assert tail_lines("a\nb\nc\n", 2, whole=False) == "b\nc\n"
    assert tail_lines("", 3, whole=True) == ""


def test_prefixes_go_before_every_line() -> None:
    assert prefix_lines("a\nb\n", "[replica 1] ") == "[replica 1] a\n[replica 1] b\n"
    assert prefix_lines("a\npartial", "> ") == "> a\n> partial"
    assert prefix_lines("", "> ") == "" and prefix_lines("x\n", "") == "x\n"


def test_only_whole_lines_are_sent_when_streams_interleave() -> None:
    assert whole_lines("", "a\nb", final=False) == ("a\n", "b")
    assert whole_lines("b", "c\n", final=False) == ("bc\n", "")
    assert whole_lines("", "no newline", final=False) == ("", "no newline")
    assert whole_lines("tail", "", final=True) == ("tail\n", "")
    assert whole_lines("", "", final=True) == ("", "")


def test_lines_carry_the_replica_when_several_may_be_shown() -> None:
    assert replica_prefix(job_view(replicas=3), None)
    assert replica_prefix(job_view(gang_nodes=2, gpus_per_node=4, gpus=8), None)
    assert not replica_prefix(job_view(replicas=3), 1)
    assert not replica_prefix(job_view(), None)


# --- the route ------------------------------------------------------------------------------------------------------
def running(bus: FakeBus, **over: Any) -> None:  # noqa: F811
    bus.jobs["j1"] = job_view(**over)
    bus.allocations.append(allocation("a1"))


async def get(app: Any, params: dict[str, Any] | None = None, token: str = "admin") -> Any:  # noqa: F811
    async with client(app, token) as c:
        return await c.get("/v1/jobs/j1/logs", params=params or {})


async def test_a_plain_read_answers_text(app, bus) -> None:  # noqa: F811
    running(bus)
    bus.write("a1", "stdout", "hello\nworld\n")
    bus.write("a1", "stderr", "warning: x\n")
    resp = await get(app, {"stream": "stdout"})
    assert resp.status_code == 200
    assert resp.headers["content-type"] == "text/plain; charset=utf-8"
    assert resp.text == "hello\nworld\n"
    assert (await get(app, {"stream": "stderr"})).text == "warning: x\n"
    assert (await get(app)).text == "hello\nworld\nwarning: x\n"  # both: stdout, then stderr, whole lines


async def test_a_plain_read_reads_past_one_chunk(app, bus, monkeypatch) -> None:  # noqa: F811
    monkeypatch.setattr(logs, "READ_BYTES", 4)
    running(bus)
    bus.write("a1", "stdout", "0123456789\n")
    assert (await get(app, {"stream": "stdout"})).text == "0123456789\n"
    assert {r.limit for r in bus.reads()} == {4}


async def test_tail_asks_for_bytes_and_cuts_to_lines(app, bus) -> None:  # noqa: F811
    running(bus)
    bus.write("a1", "stdout", "".join(f"line {i}\n" for i in range(1000)))
    resp = await get(app, {"stream": "stdout", "tail": 3})
    assert resp.text == "line 997\nline 998\nline 999\n"
    (read,) = bus.reads()
    assert read.tail == 3 * logs.TAIL_BYTES_PER_LINE


async def test_replicas_are_prefixed_and_one_can_be_picked(app, bus) -> None:  # noqa: F811
    bus.jobs["j1"] = job_view(replicas=2)
    bus.allocations += [allocation("r1", replica=1, node="n1"), allocation("r0", replica=0)]
    bus.write("r0", "stdout", "zero\n")
    bus.write("r1", "stdout", "one\n")
    bus.write("r1", "stderr", "oops")  # no newline yet: sent whole at the end of the read
    assert (await get(app)).text == "[replica 0] zero\n[replica 1] one\n[replica 1] oops\n"
    assert (await get(app, {"replica": 1, "stream": "stdout"})).text == "one\n"
    assert [r.allocation_id for r in bus.reads()][-1] == "r1"


async def test_an_earlier_attempt_can_be_read(app, bus) -> None:  # noqa: F811
    bus.jobs["j1"] = job_view(attempts=1)
    bus.allocations += [allocation("first", attempt=0), allocation("second", attempt=1)]
    bus.write("first", "stdout", "try 1\n", complete=True)
    bus.write("second", "stdout", "try 2\n")
    assert (await get(app, {"stream": "stdout"})).text == "try 2\n"
    assert (await get(app, {"stream": "stdout", "attempt": 0})).text == "try 1\n"


async def test_problems(app, bus) -> None:  # noqa: F811
    resp = await get(app)
    assert resp.status_code == 404 and resp.json()["reason"] == "JobNotFound"

    bus.jobs["j1"] = job_view(work=None)
    resp = await get(app)
    assert resp.status_code == 404 and resp.json()["reason"] == "NoLogs"
    assert "no command" in resp.json()["detail"]

    bus.jobs["j1"] = job_view(state="pending")
    resp = await get(app)
    assert resp.status_code == 404 and resp.json()["reason"] == "NoLogs"
    assert "follow=true" in resp.json()["detail"]

    running(bus)
    resp = await get(app, {"replica": 3})
    assert resp.status_code == 404 and "replica 3" in resp.json()["detail"]

    bus.silent_nodes.add("n0")
    resp = await get(app)
    assert resp.status_code == 503 and resp.json()["reason"] == "AgentUnavailable"
    assert resp.headers["content-type"] == "application/problem+json"

    for params in ({"stream": "all"}, {"tail": 0}, {"replica": -1}, {"follow": "maybe"}):
        resp = await get(app, params)
        assert resp.status_code == 422 and resp.json()["reason"] == "InvalidRequest", params


async def test_logs_are_scoped_to_the_jobs_team(app, bus) -> None:  # noqa: F811
    running(bus)
    bus.write("a1", "stdout", "secret\n")
    assert (await get(app, token="alice")).text == "secret\n"
    resp = await get(app, token="bob")
    assert resp.status_code == 403 and resp.json()["reason"] == "Forbidden"
    assert bus.reads() and all(r.allocation_id == "a1" for r in bus.reads())
    reads_before = len(bus.reads())
    await get(app, token="bob")
    assert len(bus.reads()) == reads_before  # refused before any agent was asked


# --- following ------------------------------------------------------------------------------------------------------
def script(bus: FakeBus, steps: dict[int, Any]) -> None:  # noqa: F811
    """Run steps[n] when the n-th read of the logs reaches the agents (counting ReadLogs only)."""
    count = {"reads": 0}

    def on_request(subject: str, _sent: int) -> None:
        if subject.startswith("gpupool.query.agent."):
            count["reads"] += 1
            step = steps.get(count["reads"])
            if step is not None:
                step()

    bus.on_request = on_request


async def test_follow_streams_until_the_output_is_complete_and_the_job_finished(app, bus) -> None:  # noqa: F811
    running(bus)
    bus.write("a1", "stdout", "a\n")

    def done() -> None:
        bus.write("a1", "stdout", "c\n", complete=True)
        bus.jobs["j1"] = job_view(state="completed", exit_code=0)

    script(bus, {3: lambda: bus.write("a1", "stdout", "b\n"), 5: done})
    resp = await get(app, {"stream": "stdout", "follow": "true"})
    assert resp.status_code == 200 and resp.headers["content-type"] == "text/plain; charset=utf-8"
    assert resp.text == "a\nb\nc\n"


async def test_follow_waits_for_a_pending_job_and_moves_on_to_a_restart(app, bus) -> None:  # noqa: F811
    bus.jobs["j1"] = job_view(state="pending")
    polls = {"n": 0}

    def on_request(subject: str, _sent: int) -> None:
        if subject != "gpupool.query.placement.list_allocations":
            return
        polls["n"] += 1
        if polls["n"] == 3:  # granted, started, failed at once: the queue restarts it
            bus.allocations.append(allocation("a0", attempt=0, released=True))
            bus.write("a0", "stdout", "try 1\n")
            bus.write("a0", "stderr", "boom\n", complete=True)
            bus.finish("a0")
            bus.jobs["j1"] = job_view(state="pending", attempts=1)
        if polls["n"] == 6:
            bus.allocations.append(allocation("a1", attempt=1))
            bus.write("a1", "stdout", "try 2\n")
            bus.finish("a1")
            bus.jobs["j1"] = job_view(state="completed", attempts=1, exit_code=0)

    bus.on_request = on_request
    resp = await get(app, {"follow": "true"})
    assert resp.status_code == 200
    assert resp.text == "try 1\nboom\ntry 2\n"


async def test_follow_waits_for_an_agent_that_has_not_started_the_work_yet(app, bus) -> None:  # noqa: F811
    running(bus, state="launching")
    bus.not_started.add("a1")
    assert (await get(app)).json()["reason"] == "NoLogs"  # a plain read says so

    def started() -> None:
        bus.not_started.discard("a1")
        bus.write("a1", "stdout", "up\n", complete=True)
        bus.jobs["j1"] = job_view(state="completed", exit_code=0)

    script(bus, {4: started})
    resp = await get(app, {"stream": "stdout", "follow": "true"})
    assert resp.status_code == 200 and resp.text == "up\n"


async def test_follow_ends_when_a_finished_jobs_agent_no_longer_knows_the_allocation(app, bus) -> None:  # noqa: F811
    running(bus)
    bus.write("a1", "stdout", "partial")

    def gone() -> None:
        bus.jobs["j1"] = job_view(state="failed", reason="Lost")
        bus.allocations[0]["node"] = "elsewhere"  # the agent asked answers 404 now

    script(bus, {2: gone})
    resp = await get(app, {"stream": "stdout", "follow": "true"})
    assert resp.status_code == 200 and resp.text == "partial"


async def test_follow_of_a_job_that_ended_before_it_ran_ends_empty(app, bus) -> None:  # noqa: F811
    bus.jobs["j1"] = job_view(state="cancelled")
    resp = await get(app, {"follow": "true"})
    assert resp.status_code == 200 and resp.text == ""


async def test_follow_problems_come_before_the_stream(app, bus) -> None:  # noqa: F811
    running(bus)
    bus.silent_nodes.add("n0")
    resp = await get(app, {"follow": "true"})
    assert resp.status_code == 503 and resp.json()["reason"] == "AgentUnavailable"


async def test_follow_gives_up_after_its_bound(app, bus, monkeypatch) -> None:  # noqa: F811
    monkeypatch.setattr(logs, "FOLLOW_MAX_S", 0.05)
    running(bus)
    bus.write("a1", "stdout", "forever\n")
    resp = await get(app, {"stream": "stdout", "follow": "true"})
    assert resp.text == "forever\n"


@pytest.mark.parametrize("stream", ["stdout", "both"])
async def test_follow_with_tail_starts_from_the_last_lines(app, bus, stream) -> None:  # noqa: F811
    running(bus)
    bus.write("a1", "stdout", "1\n2\n3\n")

    def done() -> None:
        bus.write("a1", "stdout", "4\n")
        bus.finish("a1")
        bus.jobs["j1"] = job_view(state="completed")

    script(bus, {3: done})
    resp = await get(app, {"stream": stream, "follow": "true", "tail": 1})
    assert resp.text == "3\n4\n"
