"""A 3-node NATS JetStream cluster on loopback, real processes: streams replicated on all three nodes lose no
acknowledged event when a node stops in the middle of a stream of publishes.

The publisher behaves like the outbox relay: every event carries `Nats-Msg-Id` = its CloudEvent id, a publish
counts only once JetStream acknowledged it, and a publish that failed (timeout, lost connection, no stream leader
while one is elected) is retried with the same id until it is acknowledged, so a stored-but-unacknowledged
attempt is dropped by the duplicate window instead of stored twice.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime
from pathlib import Path

import nats
import pytest
from nats.aio.client import Client as NATS

from libs.bus.connection import ensure_streams, stream_config
from libs.bus.consumer import ConsumerSpec, EventConsumer
from libs.bus.publisher import MSG_ID_HEADER, publish_event
from libs.contracts.envelope import CloudEvent
from libs.contracts.events import EventData, JobSubmitted
from libs.contracts.subjects import EVENTS_STREAM, JOB_SUBMITTED, STREAMS
from libs.devstack.servers import ManagedServer, jetstream_meta_leader, start_nats_cluster

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

BEFORE_STOP = 100  # events published with all three nodes up
AFTER_STOP = 100  # events published once the node is gone (more are published while it shuts down)
BATCH = 10
PUBLISH_DEADLINE_S = 30.0


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[list[ManagedServer]]:
    nodes = start_nats_cluster(tmp_path / "nats-cluster", size=3, monitor=True)
    try:
        yield nodes
    finally:
        for node in nodes:
            node.stop()


async def connect(urls: list[str], name: str) -> NATS:
    return await nats.connect(servers=urls, name=name, connect_timeout=2, max_reconnect_attempts=-1,
                              reconnect_time_wait=0.2, dont_randomize=True)


@pytest.fixture
async def clients() -> AsyncIterator[list[NATS]]:
    opened: list[NATS] = []
    yield opened
    for nc in opened:
        if not nc.is_closed:
            await nc.close()


def job_event(i: int) -> CloudEvent:
    data = JobSubmitted(job_id=f"j-{i:04d}", name="train", team="ml", project="default", kind="training",
                        priority_class="normal", priority=500, gpus=1, submitted_at=datetime.now(UTC))
    return data.to_cloudevent("/gpupool/queue", event_id=f"evt-{i:04d}")


async def publish_until_acked(js, event: CloudEvent, deadline: float) -> int:  # type: ignore[no-untyped-def]
    """Publish like the outbox relay: same id until JetStream acknowledges; return the number of attempts."""
    attempts = 0
    while True:
        attempts += 1
        try:
            await publish_event(js, JOB_SUBMITTED, event, timeout=1.0, expected_stream=EVENTS_STREAM.name)
            return attempts
        except Exception:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.1)


def test_the_cluster_elects_one_jetstream_meta_leader(cluster: list[ManagedServer]) -> None:
    assert [n.name for n in cluster] == ["nats-0", "nats-1", "nats-2"]
    assert len({n.url for n in cluster}) == 3
    views = [jetstream_meta_leader(n) for n in cluster]
    assert len(set(views)) == 1 and views[0][0] in {n.name for n in cluster} and views[0][1] == 3


async def test_a_cluster_without_monitoring_ports_forms_and_takes_replicated_streams(tmp_path: Path) -> None:
    """The default, as `gpupool up --nats-cluster` starts it: no node opens the (unauthenticated) monitoring port,
    yet start_nats_cluster returns only once every route is up and a 3-replica stream can be declared."""
    nodes = start_nats_cluster(tmp_path / "quiet", size=3)
    try:
        for node in nodes:
            assert node.monitor_url is None
            assert b"-m" not in Path(f"/proc/{node.pid}/cmdline").read_bytes().split(b"\0")
            with pytest.raises(ValueError, match="no monitoring port"):
                jetstream_meta_leader(node)
        nc = await connect([n.url for n in nodes], "quiet")
        try:
            js = nc.jetstream(timeout=10)
            await ensure_streams(js, (EVENTS_STREAM,), replicas=3)
            assert (await js.stream_info(EVENTS_STREAM.name)).config.num_replicas == 3
        finally:
            await nc.close()
    finally:
        for node in nodes:
            node.stop()


def test_stream_config_replicas_default_to_one() -> None:
    assert stream_config(EVENTS_STREAM).num_replicas == 1
    assert stream_config(EVENTS_STREAM, 3).num_replicas == 3
    with pytest.raises(ValueError):
        stream_config(EVENTS_STREAM, 0)


async def wait_for_meta_leader(nodes: list[ManagedServer], timeout: float) -> str:
    names = {n.name for n in nodes}
    deadline = time.monotonic() + timeout
    while True:
        leaders = {jetstream_meta_leader(n)[0] for n in nodes}
        if len(leaders) == 1 and leaders <= names:
            return leaders.pop()  # type: ignore[return-value]
        assert time.monotonic() < deadline, f"no JetStream meta leader among {sorted(names)}: {leaders}"
        await asyncio.sleep(0.2)


def take_down(node: ManagedServer, how: str) -> None:
    if how == "kill":  # a crash: no graceful shutdown, no flush
        os.kill(node.pid, signal.SIGKILL)
    node.stop()  # SIGTERM and wait (after a kill: just reap it)


@pytest.mark.parametrize("how", ["stop", "kill"])
async def test_no_acknowledged_event_is_lost_when_a_node_stops_mid_stream(
        cluster: list[ManagedServer], clients: list[NATS], how: str) -> None:
    by_name = {n.name: n for n in cluster}
    nc = await connect([n.url for n in cluster], "cluster-setup")
    clients.append(nc)
    js = nc.jetstream(timeout=2)
    await ensure_streams(js, replicas=3)
    for spec in STREAMS:
        info = await js.stream_info(spec.name)
        assert info.config.num_replicas == 3
        assert info.cluster is not None and len(info.cluster.replicas or []) == 2
    # The victim leads GPUPOOL_EVENTS and is the publisher's server: stopping it forces a stream leader election
    # and a client fail-over at once, the hardest single-node loss for a publisher.
    victim = by_name[(await js.stream_info(EVENTS_STREAM.name)).cluster.leader]
    survivors = [n for n in cluster if n is not victim]
    await nc.close()

    pub = await connect([victim.url, *(n.url for n in survivors)], "cluster-publisher")
    clients.append(pub)
    assert pub.connected_url is not None and pub.connected_url.port == int(victim.url.rsplit(":", 1)[1])
    pjs = pub.jetstream(timeout=2)

    deadline = time.monotonic() + PUBLISH_DEADLINE_S
    acked: list[str] = []
    retried = 0

    async def publish_batch() -> None:  # a relay batch: BATCH publishes in flight at once
        nonlocal retried
        events = [job_event(len(acked) + k) for k in range(BATCH)]
        attempts = await asyncio.gather(*(publish_until_acked(pjs, e, deadline) for e in events))
        retried += sum(attempts) - len(events)
        acked.extend(e.id for e in events)

    for _ in range(BEFORE_STOP // BATCH):
        await publish_batch()
    stopping = asyncio.create_task(asyncio.to_thread(take_down, victim, how))
    during_stop = 0
    while not stopping.done():  # publishing goes on while the node goes down
        await publish_batch()
        during_stop += BATCH
    await stopping
    assert not victim.is_running()
    for _ in range(AFTER_STOP // BATCH):  # and after it is gone, through a survivor
        await publish_batch()
    assert pub.connected_url is not None and pub.connected_url.port != int(victim.url.rsplit(":", 1)[1])
    assert during_stop >= 1
    total = len(acked)

    # Read back through a client that only knows the survivors.
    reader = await connect([n.url for n in survivors], "cluster-reader")
    clients.append(reader)
    rjs = reader.jetstream(timeout=5)
    info = await rjs.stream_info(EVENTS_STREAM.name)
    assert info.cluster.leader in {n.name for n in survivors}
    assert info.state.messages == total, f"{retried} publishes were retried, {during_stop} during the stop"
    stored = Counter()
    for seq in range(info.state.first_seq, info.state.last_seq + 1):
        msg = await rjs.get_msg(EVENTS_STREAM.name, seq)
        stored[(msg.headers or {}).get(MSG_ID_HEADER)] += 1
    assert stored == Counter(acked), "an acknowledged event is missing or stored twice"

    # A durable consumer (the services' own EventConsumer) created on the survivors reads every event.
    seen: list[str] = []
    done = asyncio.Event()

    async def handle(event: CloudEvent, _data: EventData) -> None:
        seen.append(event.id)
        if len(set(seen)) == total:
            done.set()

    # Creating a consumer is a meta-layer operation: after a crash of the meta leader the survivors first need to
    # notice and elect a new one (publishing to an existing stream only needed the stream's own leader).
    # A service whose consumer cannot be created yet exits and is restarted; the test retries the same way.
    await wait_for_meta_leader(survivors, timeout=20)
    consumer = EventConsumer(rjs, ConsumerSpec(stream=EVENTS_STREAM.name, durable="cluster-test",
                                               filter_subjects=(JOB_SUBMITTED,), ack_wait_s=5.0), handle)
    started = time.monotonic()
    while True:
        try:
            await consumer.start()
            break
        except Exception as exc:
            assert time.monotonic() - started < 20, f"durable consumer not created on the survivors: {exc!r}"
            await asyncio.sleep(0.5)
    create_s = time.monotonic() - started
    try:
        await asyncio.wait_for(done.wait(), timeout=20)
    finally:
        await consumer.stop()
    assert sorted(set(seen)) == sorted(acked)
    print(f"{how}: {total} events acknowledged ({during_stop} while {victim.name} went down, {retried} retried publishes); "
          f"stream leader now {info.cluster.leader}, consumer created in {create_s:.1f} s")
    cinfo = await rjs.consumer_info(EVENTS_STREAM.name, "cluster-test")
    assert cinfo.cluster is not None and cinfo.cluster.leader in {n.name for n in survivors}
