"""Inventory's telemetry path against real NATS and PostgreSQL: a fetched batch applies every new sample once (the
minute's rollup counts each, the latest row is the newest), applying it again changes nothing, and a bad message
in the telemetry stream is dead-lettered while the good ones around it apply."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest
from inventory_under_test import running_inventory
from nats.js import JetStreamContext
from waiting import eventually

from libs.bus.publisher import publish_event, publish_raw
from libs.bus.rpc import request
from libs.contracts import subjects
from libs.contracts.commands import RegisterNode
from libs.contracts.envelope import CloudEvent
from libs.contracts.events import GpuSpec, GpuTelemetry, JobSubmitted, TelemetrySampled
from libs.contracts.subjects import DLQ_STREAM
from libs.runtime.service import ServiceRuntime
from services.inventory.handlers import InventoryHandlers

CLUSTER = "c1"
pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("keep_test_logging_and_tracing")]


@pytest.fixture
async def inventory(nats_url: str, pg_database: str,
                    js: JetStreamContext) -> AsyncIterator[tuple[ServiceRuntime, InventoryHandlers]]:
    async with running_inventory(nats_url, pg_database, "inv-telemetry-test") as running:
        yield running


async def register(rt: ServiceRuntime, node: str, gpus: int = 2) -> None:
    cmd = RegisterNode(cluster=CLUSTER, node=node, hostname=node, cpu_count=64, memory_mib=512 * 1024,
                       gpus=[GpuSpec(uuid=f"GPU-{node}-{i}", index=i, model="H100-80GB", memory_mib=81559)
                             for i in range(gpus)])
    reply = await request(rt.nc, subjects.register_node(cmd.cluster, cmd.node), cmd, timeout=5)
    assert reply.ok, reply


def sample(node: str, at: datetime, util: float, *, gpus: int = 2, power: float | None = 100.0,
           procs: int = 0) -> TelemetrySampled:
    return TelemetrySampled(cluster=CLUSTER, node=node, sampled_at=at, gpus=[
        GpuTelemetry(uuid=f"GPU-{node}-{i}", index=i, utilization_gpu_pct=util, utilization_memory_pct=1.0,
                     memory_used_mib=1000 * (i + 1) + int(util), memory_total_mib=81559, power_w=power,
                     temperature_c=40.0 + util / 10, process_count=procs, throttle_reasons=["sw_power_cap"])
        for i in range(gpus)])


def as_batch(samples: list[TelemetrySampled]) -> list[tuple[CloudEvent, TelemetrySampled]]:
    return [(s.to_cloudevent("/gpupool/agent"), s) for s in samples]


async def test_a_batch_applies_each_new_sample_once_and_applying_it_again_changes_nothing(
        inventory) -> None:  # type: ignore[no-untyped-def]
    rt, handlers = inventory
    await register(rt, "a")
    await register(rt, "b", gpus=1)
    minute = (datetime.now(UTC) - timedelta(minutes=5)).replace(second=0, microsecond=0)
    # out of order, two nodes interleaved, one sample without power, the last one in the next minute
    batch = as_batch([sample("a", minute + timedelta(seconds=20), 30.0, procs=2),
                      sample("b", minute + timedelta(seconds=1), 5.0, gpus=1),
                      sample("a", minute + timedelta(seconds=10), 10.0, power=None),
                      sample("a", minute + timedelta(seconds=50), 80.0, procs=1),
                      sample("a", minute + timedelta(seconds=61), 50.0)])
    await handlers.on_telemetry_batch(batch)
    assert handlers.samples_applied == 4 * 2 + 1

    async def state() -> tuple[list, list]:
        async with rt.pool.acquire() as conn:
            # finished minutes, and each GPU's open one (kept on its latest row until it is over)
            rollups = await conn.fetch(
                """SELECT uuid, window_start, samples, util_sum, util_max, mem_sum, mem_max, power_sum, power_n,
                          temp_max, procs_max FROM gpu_rollups
                   UNION ALL
                   SELECT uuid, win_start, win_samples, win_util_sum, win_util_max, win_mem_sum, win_mem_max,
                          win_power_sum, win_power_n, win_temp_max, win_procs_max
                   FROM gpu_telemetry_latest WHERE win_start IS NOT NULL
                   ORDER BY uuid, window_start""")
            latest = await conn.fetch(
                "SELECT uuid, sampled_at, utilization_gpu_pct, power_w, process_count, procs_since, "
                "last_process_at, throttle_reasons FROM gpu_telemetry_latest ORDER BY uuid")
        return [tuple(r) for r in rollups], [tuple(r) for r in latest]

    rollups, latest = await state()
    next_minute = minute + timedelta(minutes=1)
    assert rollups == [
        ("GPU-a-0", minute, 3, 120.0, 80.0, 3120.0, 1080, 200.0, 2, 48.0, 2),
        ("GPU-a-0", next_minute, 1, 50.0, 50.0, 1050.0, 1050, 100.0, 1, 45.0, 0),
        ("GPU-a-1", minute, 3, 120.0, 80.0, 6120.0, 2080, 200.0, 2, 48.0, 2),
        ("GPU-a-1", next_minute, 1, 50.0, 50.0, 2050.0, 2050, 100.0, 1, 45.0, 0),
        ("GPU-b-0", minute, 1, 5.0, 5.0, 1005.0, 1005, 100.0, 1, 40.5, 0),
    ]
    newest = minute + timedelta(seconds=61)
    # the newest sample runs nothing (not running since anything) but the one at :50 did (the last time any)
    assert latest[0] == ("GPU-a-0", newest, 50.0, 100.0, 0, None, minute + timedelta(seconds=50), ["sw_power_cap"])
    assert latest[2][:2] == ("GPU-b-0", minute + timedelta(seconds=1))

    await handlers.on_telemetry_batch(batch)  # redelivered: every sample is at most as new as the stored one
    assert handlers.samples_applied == 9
    assert await state() == (rollups, latest)

    # a later sample with processes: running since then; it joins its minute, the earlier minute is unchanged
    later = minute + timedelta(seconds=70)
    await handlers.on_telemetry_batch(as_batch([sample("a", later, 60.0, procs=3)]))
    rollups2, latest2 = await state()
    assert latest2[0][4:7] == (3, later, later)
    assert rollups2[0] == rollups[0] and rollups2[1][2:5] == (2, 110.0, 60.0)

    # both minutes are over: closing emits them with every sample counted once, open ones included
    emitted = {(e.node, e.window_start): {g.uuid: g for g in e.gpus} for e in await handlers.close_rollups()}
    assert set(emitted) == {("a", minute), ("a", next_minute), ("b", minute)}
    first, second = emitted[("a", minute)]["GPU-a-0"], emitted[("a", next_minute)]["GPU-a-0"]
    assert (first.samples, first.utilization_avg_pct, first.power_avg_w, first.process_count_max) == (3, 40.0, 100.0, 2)
    assert (second.samples, second.utilization_avg_pct, second.process_count_max) == (2, 55.0, 3)
    assert emitted[("b", minute)]["GPU-b-0"].samples == 1
    assert (await state())[0] == rollups2  # moved to gpu_rollups, not changed
    await handlers.on_telemetry_batch(batch)  # a late redelivery after they were emitted: nothing moves
    assert await handlers.close_rollups() == []
    # the next sample starts a new minute on a row whose open minute the rollup pass already took: that one alone
    await handlers.on_telemetry_batch(as_batch([sample("a", minute + timedelta(seconds=130), 20.0, gpus=1)]))
    (third,) = await handlers.close_rollups()
    assert (third.window_start, [(g.uuid, g.samples, g.utilization_avg_pct) for g in third.gpus]) == (
        minute + timedelta(minutes=2), [("GPU-a-0", 1, 20.0)])


async def dead_letters(js: JetStreamContext) -> list[str]:
    state = (await js.stream_info(DLQ_STREAM.name)).state
    if not state.messages:
        return []
    return sorted([(await js.get_msg(DLQ_STREAM.name, s)).headers["Gpupool-Dlq-Reason"]
                   for s in range(state.first_seq, state.last_seq + 1)])


async def test_bad_messages_in_the_telemetry_stream_are_dead_lettered_and_the_good_ones_apply(
        inventory, js: JetStreamContext) -> None:  # type: ignore[no-untyped-def]
    rt, handlers = inventory
    await register(rt, "p")
    now = datetime.now(UTC)
    subject = subjects.telemetry(CLUSTER, "p")
    headers = {"Nats-Msg-Id": "", "Content-Type": "application/cloudevents+json"}
    await publish_event(js, subject, sample("p", now - timedelta(seconds=3), 10.0).to_cloudevent("/gpupool/agent"))
    await publish_raw(js, subject, b"{not json", {**headers, "Nats-Msg-Id": "garbage"})
    bad = sample("p", now - timedelta(seconds=2), 10.0).to_cloudevent("/gpupool/agent")
    payload = bad.model_copy(update={"data": {**bad.data, "gpus": [{**bad.data["gpus"][0],
                                                                    "utilization_gpu_pct": 150.0}]}})
    await publish_raw(js, subject, payload.to_json(), {**headers, "Nats-Msg-Id": "out-of-range"})
    job = JobSubmitted(job_id="j", name="n", team="t", project="default", kind="training",
                       priority_class="normal", priority=1, gpus=1, submitted_at=now)
    # the queue's valid event, but on a telemetry subject: refused as not arriving where its publisher sends it
    await publish_event(js, subject, job.to_cloudevent("/gpupool/queue"))
    await publish_event(js, subject, sample("p", now - timedelta(seconds=1), 20.0).to_cloudevent("/gpupool/agent"))

    async def settled() -> bool:
        return handlers.samples_applied == 2 * 2 and len(await dead_letters(js)) == 3

    await eventually(settled, timeout=20, what="good samples applied, bad ones dead-lettered")
    assert await dead_letters(js) == ["InvalidMessage", "InvalidMessage", "InvalidMessage"]
    async with rt.pool.acquire() as conn:
        assert await conn.fetchval("SELECT utilization_gpu_pct FROM gpu_telemetry_latest WHERE uuid = 'GPU-p-0'") \
            == 20.0


def by_change(s: TelemetrySampled, gpus: list[int] | None = None) -> TelemetrySampled:
    """As an agent sampling by change sends it (every second, heartbeat 5 s): only the listed GPUs."""
    kept = s.gpus if gpus is None else [g for g in s.gpus if g.index in gpus]
    return s.model_copy(update={"interval_s": 1.0, "heartbeat_s": 5.0, "gpus": kept})


async def test_samples_an_agent_left_out_as_unchanged_count_in_the_rollups_with_the_previous_values(
        inventory) -> None:  # type: ignore[no-untyped-def]
    """Sampling by change: a GPU left out of a node's messages repeated its last sent values, and its minutes count
    them for every left-out second (split at the minute boundary); a silence past the heartbeat counts only a
    heartbeat's worth, and an agent that sends every sample (no interval in its messages) gets nothing added. One
    batch, so a GPU's several samples go through several rounds of the statement."""
    rt, handlers = inventory
    await register(rt, "h")
    await register(rt, "e", gpus=1)
    minute = (datetime.now(UTC) - timedelta(minutes=5)).replace(second=0, microsecond=0)
    at = {s: minute + timedelta(seconds=s) for s in (52, 54, 57, 59, 62, 90)}
    await handlers.on_telemetry_batch(as_batch([
        by_change(sample("h", at[52], 10.0)),  # both GPUs
        by_change(sample("h", at[54], 40.0), [1]),  # GPU 1 moved (held 10 at :53); GPU 0 unchanged
        by_change(sample("h", at[57], 70.0)),  # heartbeat: GPU 0 held 10 for :53-:56, GPU 1 held 40 for :55-:56
        by_change(sample("h", at[59], 20.0), [0]),  # GPU 0 held 70 at :58
        by_change(sample("h", at[62], 30.0)),  # heartbeat: GPU 0 held 20 for :60-:61; GPU 1 held 70 for :58-:61,
        #                                        two seconds in each minute
        by_change(sample("h", at[90], 50.0)),  # after a silence: only a heartbeat's worth held (4 × 30)
        sample("e", at[52], 10.0, gpus=1), sample("e", at[57], 70.0, gpus=1),  # an agent sending every sample
    ]))
    assert handlers.samples_applied == 2 + 1 + 2 + 1 + 2 + 2 + 2
    async with rt.pool.acquire() as conn:
        rows = await conn.fetch(
            """SELECT uuid, window_start, samples, util_sum, util_max, power_n FROM gpu_rollups
               UNION ALL
               SELECT uuid, win_start, win_samples, win_util_sum, win_util_max, win_power_n
               FROM gpu_telemetry_latest WHERE win_start IS NOT NULL ORDER BY uuid, window_start""")
    next_minute = minute + timedelta(minutes=1)
    assert [tuple(r) for r in rows] == [
        ("GPU-e-0", minute, 2, 80.0, 70.0, 2),  # nothing added between :52 and :57
        # every second from :52 to :59 counted once: 5 × 10, 2 × 70, 20
        ("GPU-h-0", minute, 8, 10.0 * 5 + 70.0 * 2 + 20.0, 70.0, 8),
        # :60-:61 held 20, :62 30 and 4 held, :90 50
        ("GPU-h-0", next_minute, 8, 20.0 * 2 + 30.0 * 5 + 50.0, 50.0, 8),
        ("GPU-h-1", minute, 8, 10.0 * 2 + 40.0 * 3 + 70.0 * 3, 70.0, 8),
        ("GPU-h-1", next_minute, 8, 70.0 * 2 + 30.0 * 5 + 50.0, 70.0, 8),
    ]
    emitted = {(e.node, e.window_start): {g.uuid: g for g in e.gpus} for e in await handlers.close_rollups()}
    assert emitted[("h", minute)]["GPU-h-0"].samples == 8
    assert emitted[("h", minute)]["GPU-h-0"].utilization_avg_pct == pytest.approx(210.0 / 8)
