"""Bad input for every event consumer, on real NATS and PostgreSQL: Hypothesis generates batches of malformed bytes,
JSON that is not a CloudEvent, envelopes of an unknown (future) version of a known type, known types with a payload
missing a required field or holding a value of the wrong type, oversized documents, and replays of real events
(the same envelope under a new JetStream message id). Every service that consumes events runs in this process
(quota, queue, placement, accounting, inventory, reclamation) on its own database, after a real scenario gave them
state. After each batch: every malformed message is in the dead-letter stream once per consumer that received it,
every replay was ignored as a duplicate (no dead letter), no consumer stopped or lags, and no table of any service
changed. At the end the consumers still do real work: a new job is placed and starts."""

from __future__ import annotations

import asyncio
import json
import threading
import uuid
from collections import Counter
from collections.abc import Coroutine, Iterator
from datetime import UTC, datetime
from typing import Any

import asyncpg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from nats.js import JetStreamContext
from test_check import World

from libs.contracts import subjects
from libs.contracts.events import EVENT_TYPES

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("keep_test_logging_and_tracing")]

# What each consumer is fed: the subjects some gpupool consumer takes, and a node that exists.
EVENT_SUBJECTS = sorted({s for s in (
    subjects.JOB_SUBMITTED, subjects.JOB_COMPLETED, subjects.JOB_CANCELLED, subjects.JOB_SCALED,
    subjects.ALLOCATION_GRANTED, subjects.ALLOCATION_RELEASED, subjects.ALLOCATION_PREEMPTING,
    subjects.NODE_REGISTERED, subjects.NODE_LOST, subjects.NODE_RECOVERED, subjects.NODE_CORDONED,
    subjects.GPU_HEALTH_CHANGED, subjects.GPU_SHARING_SET, subjects.GPU_ORPHAN_DETECTED,
    subjects.QUOTA_TEAM_CREATED, subjects.QUOTA_SET, subjects.QUOTA_PRIORITY_CLASS_SET,
    subjects.QUOTA_APPROVAL_DECIDED)})
OTHER_SUBJECTS = [subjects.telemetry("c1", "whole-0"), subjects.rollup("c1", "whole-0")]
SETTLE_S = 30.0


class Loop:
    """An event loop on its own thread: the world lives there, Hypothesis (synchronous) drives it."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, Any], timeout: float = 120) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


@pytest.fixture
def loop() -> Iterator[Loop]:
    lp = Loop()
    try:
        yield lp
    finally:
        lp.close()


# --- the messages -----------------------------------------------------------------------------------------------
def envelope(type_: str, data: Any, **extra: Any) -> bytes:
    return json.dumps({"specversion": "1.0", "id": str(uuid.uuid4()), "source": "/gpupool/fuzz", "type": type_,
                       "time": datetime.now(UTC).isoformat(), "data": data, **extra}).encode()


def required_fields(event_type: str) -> list[tuple[str, str | None]]:
    """(field, JSON type) of the payload's required fields, from the model's schema."""
    schema = EVENT_TYPES[event_type].model_json_schema()
    props = schema.get("properties", {})
    return [(name, props.get(name, {}).get("type")) for name in schema.get("required", [])]


json_leaf = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=20))
json_value = st.recursive(json_leaf, lambda inner: st.lists(inner, max_size=4)
                          | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=12)


@st.composite
def poison(draw: st.DrawFn, real: list[tuple[str, bytes]]) -> tuple[str, bytes, str]:
    """(subject, body, kind) of one message no consumer may apply."""
    kind = draw(st.sampled_from(["bytes", "json", "version", "missing_field", "wrong_type", "oversized"]))
    subject = draw(st.sampled_from(EVENT_SUBJECTS + OTHER_SUBJECTS))
    if kind == "bytes":
        body = draw(st.binary(min_size=0, max_size=512))
        if body.lstrip().startswith(b"{"):
            body = b"\x00" + body
        return subject, body, kind
    if kind == "json":
        value = draw(json_value)
        if isinstance(value, dict):
            value.pop("specversion", None)  # never accidentally a CloudEvent
        return subject, json.dumps(value).encode(), kind
    event_subject, raw = draw(st.sampled_from(real))
    doc = json.loads(raw)
    if kind == "version":
        base = doc["type"].rsplit(".v", 1)[0]
        version = draw(st.integers(min_value=2, max_value=99))
        return event_subject, envelope(f"{base}.v{version}", doc["data"]), kind
    fields = required_fields(doc["type"])
    name, json_type = draw(st.sampled_from(fields))
    data = dict(doc["data"])
    if kind == "missing_field":
        data.pop(name, None)
    elif kind == "wrong_type":
        data[name] = {"not": [json_type or "a value"]} if json_type != "object" else [{"x": {"y": 1}}]
    else:  # oversized: hundreds of kilobytes that are still not a valid payload
        data.pop(name, None)
        data["padding"] = "x" * draw(st.integers(min_value=100_000, max_value=600_000))
    return event_subject, envelope(doc["type"], data), kind


# --- state, consumers and dead letters ----------------------------------------------------------------------------
async def fingerprint(world: World) -> dict[str, dict[str, str]]:
    """service → table → digest of every row: any change anywhere shows."""
    out: dict[str, dict[str, str]] = {}
    for service in world.runtimes:
        conn = await asyncpg.connect(world.dsn(service))
        try:
            tables = [r["t"] for r in await conn.fetch(
                "SELECT tablename AS t FROM pg_tables WHERE schemaname = 'public' AND tablename <> 'schema_migrations'")]
            out[service] = {t: await conn.fetchval(
                f'SELECT count(*)::text || \':\' || coalesce(md5(string_agg(md5(x::text), \'\' ORDER BY md5(x::text))), \'\') '
                f'FROM "{t}" x') for t in sorted(tables)}
        finally:
            await conn.close()
    return out


async def consumers(js: JetStreamContext) -> list[tuple[str, str, list[str], int, int]]:
    out = []
    for stream in (s.name for s in subjects.STREAMS):
        for c in await js.consumers_info(stream):
            if c.config.durable_name:
                out.append((stream, c.config.durable_name, c.config.filter_subjects or [c.config.filter_subject],
                            c.num_pending or 0, c.num_ack_pending or 0))
    return out


def takes(filters: list[str], subject: str) -> bool:
    from libs.contracts.subjects import matches

    return any(matches(f, subject) for f in filters)


async def dead_letters(js: JetStreamContext) -> set[tuple[str, str, int]]:
    """(consumer, original stream, original stream seq) of every dead letter."""
    out: set[tuple[str, str, int]] = set()
    info = await js.stream_info(subjects.DLQ_STREAM.name)
    seq = info.state.first_seq
    while info.state.messages and seq <= info.state.last_seq:
        try:
            m = await js.get_msg(subjects.DLQ_STREAM.name, seq=seq, next=True)
        except Exception:
            break
        h = m.headers or {}
        out.add((h["Gpupool-Dlq-Consumer"], h["Gpupool-Dlq-Stream"], int(h["Gpupool-Dlq-Stream-Seq"])))
        seq = m.seq + 1
    return out


async def unpublished(world: World) -> int:
    n = 0
    for service in world.runtimes:
        conn = await asyncpg.connect(world.dsn(service))
        try:
            n += await conn.fetchval("SELECT count(*) FROM outbox WHERE published_at IS NULL")
        finally:
            await conn.close()
    return n


async def idle(world: World, timeout: float = SETTLE_S) -> None:
    """Quiet: no outbox row waits to be published and no consumer has anything left (twice in a row, since
    applying one event may emit the next)."""
    js = world.runtimes["queue"].js
    deadline = asyncio.get_running_loop().time() + timeout
    quiet = 0
    while quiet < 2:
        busy = [c for c in await consumers(js) if c[3] or c[4]]
        waiting = await unpublished(world)
        quiet = quiet + 1 if not busy and not waiting else 0
        assert asyncio.get_running_loop().time() < deadline, f"never quiet: {busy}, {waiting} unpublished"
        await asyncio.sleep(0.05)


# --- the test -----------------------------------------------------------------------------------------------------
async def build(nats_url: str, pg_admin_dsn: str) -> tuple[World, list[tuple[str, bytes]]]:
    from test_check import settled

    w = World(nats_url, pg_admin_dsn, every_consumer=True)
    js = None
    try:
        from libs.bus.connection import connect

        nc = await connect(nats_url, "fuzz-cleaner")
        js = nc.jetstream()
        for info in await js.streams_info():
            await js.delete_stream(info.config.name)
        await nc.close()
        await w.start()
        for i in range(3):
            await w.submit(f"fuzz-{i}", gpus=1, gpu_models=["H100-80GB"])
        for i in range(3):
            await w.wait_state(f"fuzz-{i}", "running")
        await w.command(subjects.CMD_QUEUE_COMPLETE_JOB, _ref(w.jobs["fuzz-0"]))
        await w.wait_state("fuzz-0", "completed")
        report = await settled(w)
        assert report.ok, report.to_text()
        await idle(w)
        # every real event so far, to be replayed and mutated
        real: list[tuple[str, bytes]] = []
        js = w.runtimes["queue"].js
        info = await js.stream_info(subjects.EVENTS_STREAM.name)
        for seq in range(info.state.first_seq, info.state.last_seq + 1):
            m = await js.get_msg(subjects.EVENTS_STREAM.name, seq)
            if json.loads(m.data)["type"] in EVENT_TYPES and m.subject in EVENT_SUBJECTS:
                real.append((m.subject, m.data))
        return w, real
    except BaseException:
        await w.stop()
        raise


def _ref(job_id: str):  # type: ignore[no-untyped-def]
    from libs.contracts.commands import JobRef

    return JobRef(job_id=job_id)


async def feed(w: World, batch: list[tuple[str, bytes, str]], replays: list[tuple[str, bytes]],
               before: dict[str, dict[str, str]]) -> None:
    js = w.runtimes["queue"].js
    known = await dead_letters(js)
    durable = await consumers(js)
    expected: set[tuple[str, str, int]] = set()
    replayed: set[tuple[str, int]] = set()
    for subject, body, _kind in batch:
        ack = await js.publish(subject, body, headers={"Nats-Msg-Id": f"fuzz-{uuid.uuid4()}"})
        expected |= {(name, stream, ack.seq) for stream, name, filters, _, _ in durable
                     if stream == ack.stream and takes(filters, subject)}
    for subject, body in replays:
        ack = await js.publish(subject, body, headers={"Nats-Msg-Id": f"replay-{uuid.uuid4()}"})
        replayed.add((ack.stream, ack.seq))
    await idle(w)
    new = await dead_letters(js) - known
    assert expected <= new, f"not dead-lettered: {sorted(expected - new)}"
    assert not {d for d in new if (d[1], d[2]) in replayed}, f"a replay was dead-lettered: {new}"
    assert new <= expected, f"dead letters nobody expected: {sorted(new - expected)}"
    for service, rt in w.runtimes.items():
        for c in rt.consumers:
            assert c._task is not None and not c._task.done(), f"{service}'s consumer {c.spec.durable} stopped"
    after = await fingerprint(w)
    changed = {s: [t for t in after[s] if after[s][t] != before[s].get(t)] for s in after}
    sent = [(subject, kind, _type_of(body)) for subject, body, kind in batch] + [
        (subject, "replay", _type_of(body)) for subject, body in replays]
    assert not any(changed.values()), f"state changed: {changed} after {sent}"


def _type_of(body: bytes) -> str:
    try:
        return str(json.loads(body).get("type"))
    except Exception:
        return "-"


def test_malformed_oversized_wrong_version_and_replayed_messages_change_nothing(
        loop: Loop, nats_url: str, pg_admin_dsn: str) -> None:
    world, real = loop.run(build(nats_url, pg_admin_dsn), timeout=180)
    try:
        before = loop.run(fingerprint(world))
        examples = {"n": 0}
        seen: Counter[str] = Counter()

        @settings(max_examples=25, deadline=None, derandomize=True, database=None,
                  suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                         HealthCheck.data_too_large])
        @given(batch=st.lists(poison(real), min_size=1, max_size=8),
               replays=st.lists(st.sampled_from(real), max_size=4))
        def one_batch(batch: list[tuple[str, bytes, str]], replays: list[tuple[str, bytes]]) -> None:
            examples["n"] += 1
            seen.update(kind for _, _, kind in batch)
            seen.update(["replay"] * len(replays))
            loop.run(feed(world, batch, replays, before))

        one_batch()
        assert examples["n"] >= 10
        assert set(seen) == {"bytes", "json", "version", "missing_field", "wrong_type", "oversized", "replay"}, seen
        # the consumers still work: a new job is wanted, placed and started
        loop.run(world.submit("after-fuzz", gpus=1, gpu_models=["H100-80GB"]))
        loop.run(world.wait_state("after-fuzz", "running"))
    finally:
        loop.run(world.stop(), timeout=60)
