"""Accounting against real NATS and PostgreSQL: the service's own handlers in a ServiceRuntime, fed the events the
other services publish (jobs, allocations, nodes, orphans on GPUPOOL_EVENTS; inventory's one-minute rollups on
GPUPOOL_ROLLUPS). A scripted scenario — whole GPUs, a fraction, a MIG slice, a preemption, an idle reclaim, a
running allocation, a price change in the middle of an allocation — is checked against sums computed here by hand,
including after events are delivered a second time."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from nats.js import JetStreamContext
from waiting import eventually

from libs.bus.publisher import MSG_ID_HEADER, publish_event, publish_raw
from libs.bus.rpc import request
from libs.contracts import subjects
from libs.contracts.commands import Command, ListUsage
from libs.contracts.envelope import CloudEvent
from libs.contracts.events import (
    AllocatedGpu,
    AllocationGranted,
    AllocationReleased,
    EventData,
    GpuRollup,
    GpuSpec,
    JobSubmitted,
    NodeLost,
    NodeRegistered,
    OrphanDetected,
    TelemetryRolledUp,
    subject_for,
)
from libs.contracts.origins import owner_of
from libs.contracts.reports import (
    CapacityReportQuery,
    EfficiencyReportQuery,
    HistoryQuery,
    ListCostRates,
    SetCostRate,
    UsageReportQuery,
    UtilizationQuery,
    WasteReportQuery,
)
from libs.contracts.subjects import EVENTS_STREAM
from libs.runtime.service import ServiceRuntime
from services.accounting.bootstrap import mount
from services.accounting.config import AccountingSettings
from services.accounting.handlers import AccountingHandlers

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("keep_test_logging_and_tracing")]

NOW = datetime.now(UTC)
BASE = NOW.replace(second=0, microsecond=0) - timedelta(hours=3)
H100, A100 = "H100-80GB", "A100-80GB"
US = timedelta(microseconds=1)


def at(minutes: float, micro: int = 0) -> datetime:
    return BASE + timedelta(minutes=minutes, microseconds=micro)


@pytest.fixture
async def accounting(nats_url: str, pg_database: str, js: JetStreamContext) -> AsyncIterator[ServiceRuntime]:
    settings = AccountingSettings(nats_url=nats_url, database_url=pg_database, http_port=0, log_level="WARNING",
                                  instance="acct-test", idle_util_pct=5.0, currency="EUR")
    rt = ServiceRuntime("accounting", settings, migrations_package="services.accounting")
    await rt.start()
    await mount(rt, AccountingHandlers(rt, settings))
    try:
        yield rt
    finally:
        await rt.shutdown()


async def publish(js: JetStreamContext, data: EventData, source: str, *, time: datetime | None = None) -> CloudEvent:
    event = data.to_cloudevent(source, time=time)
    await publish_event(js, subject_for(data), event)
    return event


async def ask(rt: ServiceRuntime, subject: str, cmd: Command) -> dict:
    reply = await request(rt.nc, subject, cmd, timeout=10)
    assert reply.ok, reply.error
    return reply.result


def gpus(node: str, indexes: list[int], model: str, **share: object) -> list[AllocatedGpu]:
    return [AllocatedGpu(uuid=f"GPU-{node}-{i}", index=i, model=model, **share) for i in indexes]  # type: ignore[arg-type]


def node(name: str, model: str, count: int) -> NodeRegistered:
    return NodeRegistered(cluster="c1", node=name, hostname=name, cpu_count=64, memory_mib=1 << 19,
                          gpus=[GpuSpec(uuid=f"GPU-{name}-{i}", index=i, model=model, memory_mib=81920)
                                for i in range(count)], registered_at=at(-120))


def job(job_id: str, team: str, user: str, gpus_: int = 1, model: str = H100, **shape: object) -> JobSubmitted:
    return JobSubmitted(job_id=job_id, name=job_id, team=team, project="p1", kind="training", priority_class="normal",
                        priority=500, gpus=gpus_, gpu_models=[model], submitted_at=BASE, submitted_by=user,
                        **shape)  # type: ignore[arg-type]


def grant(alloc: str, job_id: str, team: str, node_: str, held: list[AllocatedGpu], when: datetime,
          kind: str = "training") -> AllocationGranted:
    return AllocationGranted(allocation_id=alloc, job_id=job_id, team=team, project="p1", cluster="c1", node=node_,
                             gpus=held, granted_at=when, kind=kind)


def release(g: AllocationGranted, when: datetime, reason: str) -> AllocationReleased:
    return AllocationReleased(allocation_id=g.allocation_id, job_id=g.job_id, team=g.team, project=g.project,
                              cluster=g.cluster, node=g.node, gpus=g.gpus, granted_at=g.granted_at,
                              released_at=when, reason=reason)


def rollup(node_: str, minute: int, utils: dict[int, float]) -> TelemetryRolledUp:
    return TelemetryRolledUp(cluster="c1", node=node_, window_start=at(minute), window_end=at(minute + 1),
                             gpus=[GpuRollup(uuid=f"GPU-{node_}-{i}", index=i, samples=12, utilization_avg_pct=u,
                                             utilization_max_pct=u, memory_used_avg_mib=1024.0,
                                             memory_used_max_mib=1024) for i, u in utils.items()])


# The scenario (minutes after BASE; BASE is three hours ago):
#   A  research/alice  2 × H100 (n1 GPU 0, 1)     0:00.25 → 60:00.75  completed    GPU 0 busy 80 %, GPU 1 idle 2 %
#   B  inference/bob   ½ of A100 (n2 GPU 0)       10      → 70        IdleReclaimed   1 %
#   C  research/carol  MIG 3g.40gb (n2 GPU 1)     20      → 50        PreemptedByPriority  30 %
#   D  inference/bob   1 × H100 (n1 GPU 2)        90      → running    50 %
#   E  inference/bob   4 × H100, never placed (waits from 100)
# Queue entries: A at -5, B at 5, C at 0, D at 30, E at 100. Report range: [-60, 120) minutes.
A = grant("a-A", "A", "research", "n1", gpus("n1", [0, 1], H100), at(0, 250_000))
B = grant("a-B", "B", "inference", "n2", gpus("n2", [0], A100, share_milli=500, memory_mib=40960), at(10))
C = grant("a-C", "C", "research", "n2", gpus("n2", [1], A100, share_milli=429, mig_profile="3g.40gb"), at(20))
D = grant("a-D", "D", "inference", "n1", gpus("n1", [2], H100), at(90))
RA, RB, RC = release(A, at(60, 750_000), "JobCompleted"), release(B, at(70), "IdleReclaimed"), \
    release(C, at(50), "PreemptedByPriority")
RANGE = (at(-60), at(120))
PRICES = [(H100, "", at(-1440), "2.50"), (H100, "", at(30), "3.00"), (A100, "", at(-1440), "1.20"),
          (A100, "3g.40gb", at(-1440), "0.60")]


def us(a: datetime, b: datetime) -> int:
    return (b - a) // US


def expected() -> dict:
    """GPU-seconds and cost of the scenario inside RANGE, computed from the timestamps alone."""
    a_us, b_us, c_us = us(A.granted_at, RA.released_at), us(B.granted_at, RB.released_at), \
        us(C.granted_at, RC.released_at)
    d_us = us(D.granted_at, RANGE[1])
    hour = Decimal(3600 * 10**6)
    a_cost = 2 * (Decimal(us(A.granted_at, at(30))) * Decimal("2.50") + Decimal(us(at(30), RA.released_at))
                  * Decimal("3.00")) / hour
    b_cost = Decimal(b_us) * Decimal("0.5") * Decimal("1.20") / hour
    c_cost = Decimal(c_us) * Decimal("0.60") / hour  # a MIG slice pays its profile's instance-hour price
    d_cost = Decimal(d_us) * Decimal("3.00") / hour
    sec = Decimal(10**6)
    return {
        "research": (Decimal(a_us * 2) / sec + Decimal(c_us) * Decimal("0.429") / sec, a_cost + c_cost),
        "inference": (Decimal(b_us) * Decimal("0.5") / sec + Decimal(d_us) / sec, b_cost + d_cost),
        "a_us": a_us, "b_us": b_us, "c_us": c_us, "d_us": d_us,
    }


def q6(value: Decimal) -> float:
    return float(value.quantize(Decimal("0.000001")))


async def rollups_stored(rt: ServiceRuntime, n: int) -> bool:
    assert rt.pool is not None
    return await rt.pool.fetchval("SELECT count(*) FROM gpu_rollups") == n


async def play_scenario(js: JetStreamContext, rt: ServiceRuntime) -> dict[str, CloudEvent]:
    sent: dict[str, CloudEvent] = {}
    for price_model, profile, frm, price in PRICES:
        await ask(rt, subjects.CMD_ACCOUNTING_SET_COST_RATE, SetCostRate(
            gpu_model=price_model, mig_profile=profile, effective_from=frm, price_per_hour=Decimal(price),
            set_by="admin"))
    # Rollups that arrive before the allocations they describe (n2 for the whole story, n1 for the first half):
    # the grant picks them up, and the release takes back what lies after it.
    for m in range(0, 76):
        await publish(js, rollup("n2", m, {0: 1.0, 1: 30.0}), "/gpupool/inventory")
    for m in range(0, 31):
        await publish(js, rollup("n1", m, {0: 80.0, 1: 2.0, 2: 50.0, 3: 0.0}), "/gpupool/inventory")
    await eventually(lambda: rollups_stored(rt, 76 * 2 + 31 * 4), what="early rollups stored")

    await publish(js, node("n1", H100, 4), "/gpupool/inventory")
    await publish(js, node("n2", A100, 2), "/gpupool/inventory")
    queue = [("A", job("A", "research", "alice", 2), -5), ("C", job("C", "research", "carol", 1, A100,
                                                                      mig_profile="3g.40gb"), 0),
             ("B", job("B", "inference", "bob", 1, A100, gpu_fraction_milli=500), 5),
             ("D", job("D", "inference", "bob"), 30), ("E", job("E", "inference", "bob", 4), 100)]
    timeline: list[tuple[datetime, str, EventData]] = [(at(m), f"submit-{n}", j) for n, j, m in queue]
    timeline += [(A.granted_at, "grant-A", A), (B.granted_at, "grant-B", B), (C.granted_at, "grant-C", C),
                 (D.granted_at, "grant-D", D), (RA.released_at, "release-A", RA), (RB.released_at, "release-B", RB),
                 (RC.released_at, "release-C", RC)]
    timeline.append((at(110), "lost-n2", NodeLost(cluster="c1", node="n2", last_seen_at=at(105),
                                                  detected_at=at(110))))
    timeline.append((at(115), "orphan", OrphanDetected(cluster="c1", node="n1", gpu_uuid="GPU-n1-3",
                                                       orphan="process_without_allocation", pids=[4242],
                                                       since=at(112), detected_at=at(115))))
    for when, name, data in sorted(timeline, key=lambda t: t[0]):
        source = f"/gpupool/{owner_of(data.event_type)}"  # each event from the service that owns it
        sent[name] = await publish(js, data, source, time=when)
    for m in range(31, 125):
        await publish(js, rollup("n1", m, {0: 80.0, 1: 2.0, 2: 50.0, 3: 0.0}), "/gpupool/inventory")
    await eventually(lambda: rollups_stored(rt, 76 * 2 + 125 * 4), what="all rollups stored")
    await eventually(lambda: ledger_rows(rt, 3), what="three ledger rows")
    await eventually(lambda: orphan_seen(rt), what="the orphan recorded")
    return sent


async def ledger_rows(rt: ServiceRuntime, n: int) -> bool:
    assert rt.pool is not None
    return await rt.pool.fetchval("SELECT count(*) FROM usage_ledger") == n


async def orphan_seen(rt: ServiceRuntime) -> bool:
    assert rt.pool is not None
    return await rt.pool.fetchval("SELECT count(*) FROM orphans") == 1


async def usage(rt: ServiceRuntime, group_by: list[str], **filters: list[str]) -> dict:
    return await ask(rt, subjects.QUERY_ACCOUNTING_REPORT_USAGE,
                     UsageReportQuery(start=RANGE[0], end=RANGE[1], group_by=group_by, filters=filters))


async def test_usage_report_matches_hand_computed_gpu_seconds_and_cost_even_after_redelivery(
        accounting: ServiceRuntime, js: JetStreamContext) -> None:
    sent = await play_scenario(js, accounting)
    want = expected()
    by_team = await usage(accounting, ["team"])
    assert by_team["currency"] == "EUR" and by_team["as_of"] == RANGE[1].isoformat()
    rows = {r["team"]: r for r in by_team["rows"]}
    for team in ("research", "inference"):
        seconds, cost = want[team]
        assert rows[team]["gpu_seconds"] == q6(seconds), team
        assert rows[team]["cost"] == q6(cost), team
        assert rows[team]["unpriced_gpu_seconds"] == 0
    assert rows["research"]["allocations"] == 2 and rows["inference"]["allocations"] == 2
    assert [r["team"] for r in by_team["rows"]] == ["research", "inference"]  # largest first

    # Every event of the story delivered again (as after a crash between commit and ack, or a republish past the
    # duplicate window), a second release of A under a new event id, and a rollup again: nothing changes.
    for event in sent.values():
        await publish_raw(js, subject_for_event(event), event.to_json(), {MSG_ID_HEADER: f"again-{event.id}"})
    second = release(A, RA.released_at + timedelta(seconds=5), "JobCompleted")
    await publish(js, second, "/gpupool/placement")
    replayed = rollup("n1", 45, {0: 80.0, 1: 2.0, 2: 50.0, 3: 0.0}).to_cloudevent("/gpupool/inventory")
    await publish_raw(js, subjects.rollup("c1", "n1"), replayed.to_json(), {MSG_ID_HEADER: "rollup-again"})
    await eventually(lambda: consumer_caught_up(js), what="redeliveries consumed")
    assert await usage(accounting, ["team"]) == {**by_team, "as_of": by_team["as_of"]}
    ledger = await ask(accounting, subjects.QUERY_ACCOUNTING_LIST_USAGE, ListUsage())
    assert sorted(r["allocation_id"] for r in ledger["items"]) == ["a-A", "a-B", "a-C"]
    a_row = next(r for r in ledger["items"] if r["allocation_id"] == "a-A")
    assert a_row["gpu_seconds"] == want["a_us"] * 2 / 1e6 and a_row["user"] == "alice"

    # the other dimensions, and filters
    by_user = {r["user"]: r["gpu_seconds"] for r in (await usage(accounting, ["user"]))["rows"]}
    assert by_user == {"alice": want["a_us"] * 2 / 1e6, "bob": q6(want["inference"][0]),
                       "carol": q6(Decimal(want["c_us"]) * Decimal("0.429") / 10**6)}
    by_sharing = {r["sharing"]: r["gpu_seconds"] for r in (await usage(accounting, ["sharing"]))["rows"]}
    assert by_sharing == {"whole": q6(Decimal(want["a_us"] * 2 + want["d_us"]) / 10**6),
                          "fraction": q6(Decimal(want["b_us"]) / 2 / 10**6),
                          "mig": q6(Decimal(want["c_us"]) * Decimal("0.429") / 10**6)}
    mig = await usage(accounting, ["gpu_model", "mig_profile"], sharing=["mig"])
    assert [(r["gpu_model"], r["mig_profile"], r["allocations"]) for r in mig["rows"]] == [(A100, "3g.40gb", 1)]
    only = await usage(accounting, [], team=["research"], kind=["training"])
    assert only["rows"][0]["gpu_seconds"] == q6(want["research"][0]) == only["total"]["gpu_seconds"]

    # a range cutting A in two adds back up to the whole
    halves = [await ask(accounting, subjects.QUERY_ACCOUNTING_REPORT_USAGE, UsageReportQuery(
        start=s, end=e, filters={"user": ["alice"]})) for s, e in ((at(-60), at(17, 3)), (at(17, 3), at(120)))]
    assert sum(h["total"]["gpu_seconds"] for h in halves) == pytest.approx(want["a_us"] * 2 / 1e6, abs=2e-6)


def subject_for_event(event: CloudEvent) -> str:
    from libs.contracts.events import decode_data

    return subject_for(decode_data(event))


async def consumer_caught_up(js: JetStreamContext) -> bool:
    events = await js.consumer_info(EVENTS_STREAM.name, "accounting")
    rollups = await js.consumer_info(subjects.ROLLUPS_STREAM.name, "accounting-rollups")
    return all(i.num_pending == 0 and i.num_ack_pending == 0 for i in (events, rollups))


async def test_efficiency_waste_and_capacity_reports_follow_the_rollups_queue_and_supply(
        accounting: ServiceRuntime, js: JetStreamContext) -> None:
    await play_scenario(js, accounting)
    want = expected()
    hours = Decimal(3600 * 10**6)

    eff = await ask(accounting, subjects.QUERY_ACCOUNTING_REPORT_EFFICIENCY,
                    EfficiencyReportQuery(start=RANGE[0], end=RANGE[1]))
    rows = {r["team"]: r for r in eff["rows"]}
    a, b, c, d = (Decimal(want[k]) for k in ("a_us", "b_us", "c_us", "d_us"))
    research_used = (a * Decimal("0.80") + a * Decimal("0.02") + c * Decimal("0.429") * Decimal("0.30")) / hours
    inference_used = (b * Decimal("0.5") * Decimal("0.01") + d * Decimal("0.50")) / hours
    assert rows["research"]["used_gpu_hours"] == pytest.approx(float(research_used), abs=2e-6)
    assert rows["inference"]["used_gpu_hours"] == pytest.approx(float(inference_used), abs=2e-6)
    assert rows["research"]["idle_gpu_hours"] == pytest.approx(float(a / hours), abs=2e-6)  # GPU 1 of A
    assert rows["inference"]["idle_gpu_hours"] == pytest.approx(float(b / 2 / hours), abs=2e-6)  # all of B
    assert rows["research"]["telemetry_coverage_pct"] == 100.0
    assert rows["research"]["allocated_gpu_hours"] == pytest.approx(float(want["research"][0] / 3600), abs=2e-6)

    waste = await ask(accounting, subjects.QUERY_ACCOUNTING_REPORT_WASTE,
                      WasteReportQuery(start=RANGE[0], end=RANGE[1]))
    named = [(x["allocation_id"], x["idle_fraction"]) for x in waste["idle_allocations"]]
    assert named == [("a-A", 0.5), ("a-B", 1.0)]  # most idle GPU-hours first; C and D were busy
    assert waste["idle_allocations"][1]["release_reason"] == "IdleReclaimed"
    assert waste["idle_gpu_hours"] == pytest.approx(float((a + b / 2) / hours), abs=2e-6)
    (orphan,) = waste["orphans"]
    assert orphan["gpu_uuid"] == "GPU-n1-3" and orphan["pids"] == [4242]
    team_only = await ask(accounting, subjects.QUERY_ACCOUNTING_REPORT_WASTE, WasteReportQuery(
        start=RANGE[0], end=RANGE[1], filters={"team": ["inference"]}, min_idle_fraction=0.9))
    assert [x["allocation_id"] for x in team_only["idle_allocations"]] == ["a-B"]
    assert team_only["orphans"] == []  # an orphan process belongs to no team

    cap = await ask(accounting, subjects.QUERY_ACCOUNTING_REPORT_CAPACITY,
                    CapacityReportQuery(start=RANGE[0], end=RANGE[1], bucket_s=3600))
    models = {m["gpu_model"]: m for m in cap["models"]}
    h100, a100 = models[H100], models[A100]
    assert h100["supply_gpus"] == 4 and a100["supply_gpus"] == 0  # n2 was lost
    assert [t["supply_gpus"] for t in a100["trend"]] == [2, 2, 0]
    # waits: A 5 min + 0.25 s, D 60 min; B 5 min, C 20 min (percentile_cont interpolates)
    assert h100["demand"]["waits"] == 2 and a100["demand"]["waits"] == 2
    assert h100["demand"]["wait_p50_s"] == pytest.approx((300.25 + 3600) / 2)
    assert a100["demand"]["wait_p50_s"] == pytest.approx(750.0) and a100["demand"]["wait_max_s"] == 1200.0
    queued = (Decimal(us(at(-5), A.granted_at)) * 2 + Decimal(us(at(30), D.granted_at))
              + Decimal(us(at(100), RANGE[1])) * 4) / hours
    assert h100["demand"]["queued_gpu_hours"] == pytest.approx(float(queued), abs=2e-6)
    assert [t["peak_demand_gpus"] for t in h100["trend"]] == [2.0, 3.0, 5.0]
    assert [t["peak_allocated_gpus"] for t in h100["trend"]] == [0.0, 2.0, 2.0]  # A until 60:00.75
    assert h100["demand"]["peak_demand_gpus"] == 5.0 and h100["demand"]["pending_gpus"] == 4.0  # E, at the end
    assert h100["forecast"]["status"] == "exceeds"  # E's four GPUs on top of D's one: five > four
    rising = await ask(accounting, subjects.QUERY_ACCOUNTING_REPORT_CAPACITY,
                       CapacityReportQuery(start=at(-60), end=at(100), bucket_s=1800, gpu_model=H100))
    (only,) = rising["models"]
    assert only["forecast"]["status"] == "will_exceed" and only["forecast"]["slope_gpus_per_day"] > 0
    assert datetime.fromisoformat(only["forecast"]["exceeds_supply_at"]) > at(100)
    before_e = await ask(accounting, subjects.QUERY_ACCOUNTING_REPORT_CAPACITY,
                         CapacityReportQuery(start=at(-60), end=at(95), bucket_s=3600))
    assert {m["gpu_model"]: m for m in before_e["models"]}[H100]["demand"]["pending_gpus"] == 0.0  # D just placed
    now = await ask(accounting, subjects.QUERY_ACCOUNTING_REPORT_CAPACITY,
                    CapacityReportQuery(start=at(-60), end=NOW + timedelta(hours=1), bucket_s=3600))
    assert {m["gpu_model"]: m for m in now["models"]}[H100]["demand"]["pending_gpus"] == 4.0  # E still waits


async def test_cost_rates_are_events_and_a_price_can_be_withdrawn(accounting: ServiceRuntime,
                                                                  js: JetStreamContext) -> None:
    cmd = SetCostRate(gpu_model=H100, effective_from=at(0), price_per_hour=Decimal("2.125"), set_by="root")
    first = await ask(accounting, subjects.CMD_ACCOUNTING_SET_COST_RATE, cmd)
    assert first["before"] is None and first["after"]["price_per_hour"] == 2.125
    again = await ask(accounting, subjects.CMD_ACCOUNTING_SET_COST_RATE,
                      cmd.model_copy(update={"price_per_hour": Decimal("2.5")}))
    assert again["before"]["price_per_hour"] == 2.125 and again["after"]["price_per_hour"] == 2.5
    listed = await ask(accounting, subjects.QUERY_ACCOUNTING_COST_RATES, ListCostRates())
    assert [(r["gpu_model"], r["price_per_hour"]) for r in listed["items"]] == [(H100, 2.5)]
    gone = await ask(accounting, subjects.CMD_ACCOUNTING_SET_COST_RATE,
                     cmd.model_copy(update={"delete": True, "price_per_hour": None}))
    assert gone["after"] is None
    missing = await request(accounting.nc, subjects.CMD_ACCOUNTING_SET_COST_RATE,
                            cmd.model_copy(update={"delete": True, "price_per_hour": None}), timeout=5)
    assert not missing.ok and missing.error is not None and missing.error.reason == "CostRateNotFound"

    async def three_events() -> bool:
        info = await js.stream_info(EVENTS_STREAM.name, subjects_filter=subjects.USAGE_RATE_SET)
        return (info.state.subjects or {}).get(subjects.USAGE_RATE_SET) == 3

    await eventually(three_events, what="three CostRateSet events on the stream")


async def test_history_export_lists_each_jobs_request_wait_and_last_run_a_page_at_a_time(
        accounting: ServiceRuntime, js: JetStreamContext) -> None:
    await play_scenario(js, accounting)
    first = await ask(accounting, subjects.QUERY_ACCOUNTING_EXPORT_HISTORY,
                      HistoryQuery(start=RANGE[0], end=RANGE[1], limit=3))
    assert [j["job_id"] for j in first["items"]] == ["A", "B", "C"] and first["next"] == "C"
    rest = await ask(accounting, subjects.QUERY_ACCOUNTING_EXPORT_HISTORY,
                     HistoryQuery(start=RANGE[0], end=RANGE[1], after="C"))
    assert [j["job_id"] for j in rest["items"]] == ["D", "E"] and rest["next"] is None
    jobs = {j["job_id"]: j for j in first["items"] + rest["items"]}
    a, b, c, d, e = (jobs[k] for k in "ABCDE")
    assert (a["gpus"], a["gpu_models"], a["priority"], a["priority_class"], a["team"], a["user"]) == \
        (2, [H100], 500, "normal", "research", "alice")
    assert a["submitted_at"] == at(-5).isoformat() and a["submit_time"] == round(at(-5).timestamp(), 6)
    assert a["wait_s"] == us(at(-5), A.granted_at) / 1e6 and a["duration_s"] == us(A.granted_at, RA.released_at) / 1e6
    assert (a["state"], a["gpu_model_granted"], a["ended_at"], a["gpu_share"]) == \
        ("ended", H100, RA.released_at.isoformat(), 2.0)
    assert (b["gpus"], b["gpu_fraction_milli"], b["gpu_share"], b["duration_s"]) == (1, 500, 0.5, 3600.0)
    assert (c["mig_profile"], c["state"], c["duration_s"], c["wait_s"]) == ("3g.40gb", "ended", 1800.0, 1200.0)
    assert (d["state"], d["ended_at"], d["duration_s"]) == ("running", None, us(D.granted_at, RANGE[1]) / 1e6)
    assert (e["state"], e["gpus"], e["duration_s"], e["started_at"]) == ("waiting", 4, None, None)
    research = await ask(accounting, subjects.QUERY_ACCOUNTING_EXPORT_HISTORY,
                         HistoryQuery(start=RANGE[0], end=RANGE[1], teams=["research"]))
    assert [j["job_id"] for j in research["items"]] == ["A", "C"]
    later = await ask(accounting, subjects.QUERY_ACCOUNTING_EXPORT_HISTORY,
                      HistoryQuery(start=at(20), end=RANGE[1]))
    assert [j["job_id"] for j in later["items"]] == ["D", "E"]  # entered the queue at 30 and 100


async def test_utilization_history_of_a_job_and_of_a_team_from_the_rollups(accounting: ServiceRuntime,
                                                                           js: JetStreamContext) -> None:
    """X (research, 2 whole GPUs on n3: 90 % and 2 %) from 0:30 to 4:00; Y (research, half of n4 GPU 0 at 40 %)
    from minute 2 on, still running; Z (inference, n4 GPU 1 at 99 %) all along. Rollups for minutes 0..5."""
    x = grant("a-X", "X", "research", "n3", gpus("n3", [0, 1], H100), at(0, 30_000_000))
    y = grant("a-Y", "Y", "research", "n4", gpus("n4", [0], A100, share_milli=500, memory_mib=40960), at(2))
    z = grant("a-Z", "Z", "inference", "n4", gpus("n4", [1], A100), at(-10))
    for data in (x, y, z, release(x, at(4), "JobCompleted")):
        await publish(js, data, "/gpupool/placement", time=data.granted_at)
    for m in range(6):
        await publish(js, rollup("n3", m, {0: 90.0, 1: 2.0}), "/gpupool/inventory")
        await publish(js, rollup("n4", m, {0: 40.0, 1: 99.0}), "/gpupool/inventory")
    await eventually(lambda: rollups_stored(accounting, 24), what="the rollups stored")
    await eventually(lambda: ledger_rows(accounting, 1), what="X released")

    job = await ask(accounting, subjects.QUERY_ACCOUNTING_UTILIZATION,
                    UtilizationQuery(start=at(0), end=at(6), job_id="X", step_s=60))
    assert job["job_id"] == "X" and job["team"] is None and job["step_s"] == 60
    points = job["points"]
    assert [p["start"] for p in points] == [at(m).isoformat() for m in range(6)]
    assert [p["utilization_pct"] for p in points] == [46.0] * 4 + [None, None]  # released at 4:00
    assert [p["gpus"] for p in points] == [1.0, 2.0, 2.0, 2.0, 0.0, 0.0]  # minute 0: held its second half
    assert {p["max_utilization_pct"] for p in points[:4]} == {90.0} and {p["idle_pct"] for p in points[:4]} == {50.0}
    assert [p["allocations"] for p in points] == [1, 1, 1, 1, 0, 0]
    assert job["avg_utilization_pct"] == 46.0 and job["idle_pct"] == 50.0
    assert job["measured_gpu_hours"] == round(2 * 3.5 / 60, 6)

    coarse = await ask(accounting, subjects.QUERY_ACCOUNTING_UTILIZATION,
                       UtilizationQuery(start=at(0), end=at(6), job_id="X", step_s=120))
    assert [p["gpus"] for p in coarse["points"]] == [1.5, 2.0, 0.0]  # 2 GPUs × 90 s of 120 s, then all

    team = await ask(accounting, subjects.QUERY_ACCOUNTING_UTILIZATION,
                     UtilizationQuery(start=at(0), end=at(6), team="research", step_s=60))
    utils = [p["utilization_pct"] for p in team["points"]]
    # minute 2 and 3: X's 2 GPUs at 46 % and Y's half GPU at 40 %; Z (inference) never counts
    assert utils[:2] == [46.0, 46.0] and utils[2:4] == [44.8, 44.8] and utils[4:] == [40.0, 40.0]
    assert [p["gpus"] for p in team["points"]] == [1.0, 2.0, 2.5, 2.5, 0.5, 0.5]
    assert team["points"][2]["idle_pct"] == 40.0 and team["points"][2]["allocations"] == 2
    assert team["max_utilization_pct"] == 90.0

    nobody = await ask(accounting, subjects.QUERY_ACCOUNTING_UTILIZATION,
                       UtilizationQuery(start=at(0), end=at(6), team="nobody", step_s=60))
    assert len(nobody["points"]) == 6 and nobody["avg_utilization_pct"] is None
    assert all(p["utilization_pct"] is None and p["gpus"] == 0.0 for p in nobody["points"])
    bad = await request(accounting.nc, subjects.QUERY_ACCOUNTING_UTILIZATION,
                        UtilizationQuery.model_construct(start=at(0), end=at(6), step_s=60), timeout=10)
    assert not bad.ok and bad.error.status == 400
