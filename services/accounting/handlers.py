"""Accounting service: every GPU-second of every allocation in an exact ledger, its utilization from inventory's
rollups, prices with effective dates, and the usage / efficiency / capacity / waste reports built on them."""

from __future__ import annotations

import asyncio
import logging
import math
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from libs.bus.consumer import Busy, Poison
from libs.contracts import subjects
from libs.contracts.commands import ListUsage, Reply, page
from libs.contracts.envelope import CloudEvent, utcnow
from libs.contracts.events import (
    AllocationGranted,
    AllocationReleased,
    CostRateSet,
    EventData,
    GpuHealthChanged,
    JobCancelled,
    JobSubmitted,
    NodeLost,
    NodeRecovered,
    NodeRegistered,
    OrphanDetected,
    TelemetryRolledUp,
    UsageRecorded,
)
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
from libs.runtime.routes import Routes, once
from libs.runtime.service import ServiceRuntime
from services.accounting import store
from services.accounting.config import AccountingSettings
from services.accounting.domain import (
    MILLI,
    US_PER_HOUR,
    BucketLevels,
    Rate,
    Totals,
    allocation_sharing,
    bucket_peaks,
    demand_forecast,
    demand_milli,
    dominant_model,
    efficiency_row,
    fold_pieces,
    gpu_milli_us,
    history_item,
    linear_forecast,
    requested_model,
    segment_bounds,
    share_milli,
    usage_row,
    utilization_series,
)

log = logging.getLogger(__name__)
CONSUMER = "accounting"


class AllocationBusy(Busy):
    """Another replica's batch is applying an event of the same allocation: retried after a back-off (the consumer
    naks it) rather than waited for, since that wait can deadlock the two batches."""


async def _lock_allocation(conn: Any, data: AllocationGranted | AllocationReleased) -> Any:
    """The allocation's locks (store.lock_allocation), and the job's user and kinds read with them."""
    context = await store.lock_allocation(conn, data)
    if not context["locked"]:
        raise AllocationBusy(f"allocation {data.allocation_id} is being applied by another transaction")
    return context


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def _rate_view(r: Any) -> dict[str, Any]:
    return {"gpu_model": r["gpu_model"], "mig_profile": r["mig_profile"],
            "effective_from": r["effective_from"].isoformat(), "price_per_hour": float(r["price_per_hour"]),
            "set_by": r["set_by"], "set_at": r["set_at"].isoformat()}


class AccountingHandlers:
    def __init__(self, runtime: ServiceRuntime, settings: AccountingSettings | None = None) -> None:
        self.rt = runtime
        self.settings = settings or AccountingSettings()

    @property
    def idle_pct(self) -> float:
        return self.settings.idle_util_pct

    # --- jobs: the user dimension and queue waits ----------------------------------------------------------------
    async def on_job_submitted(self, event: CloudEvent, data: JobSubmitted) -> None:
        """A job entered the queue (first submission, approval, or requeue): a wait starts now."""
        async with self.rt.uow() as uow:
            await store.job_submitted(uow.conn, data, data.submitted_by or "unknown", entered_at=event.time,
                                      demand_milli=demand_milli(data), gpu_model=requested_model(data))

    async def on_job_cancelled(self, event: CloudEvent, data: JobCancelled) -> None:
        async with self.rt.uow() as uow:
            await store.close_wait(uow.conn, data.job_id, data.cancelled_at, "cancelled")

    # --- allocations: the ledger ------------------------------------------------------------------------------------
    async def on_allocation_granted(self, event: CloudEvent, data: AllocationGranted) -> None:
        async with self.rt.uow() as uow:
            user = (await _lock_allocation(uow.conn, data))["user_name"]
            await store.insert_intervals(uow.conn, data, user=user, kind=data.kind, granted_at=data.granted_at,
                                         released_at=None, reason=None, idle_util_pct=self.idle_pct,
                                         wait_granted=dominant_model(data))  # and the queue wait ends

    async def on_allocation_released(self, event: CloudEvent, data: AllocationReleased) -> None:
        """Close the allocation's GPU rows and write its ledger row, exactly once whatever is redelivered (inbox,
        then the rows themselves: a second release of the same allocation finds nothing open)."""
        milli_us = gpu_milli_us(data)
        model = dominant_model(data)
        async with self.rt.uow() as uow:
            context = await _lock_allocation(uow.conn, data)
            user, kind, job_kind = context["user_name"], context["interval_kind"], context["job_kind"]
            if kind is None:  # granted before accounting listened: the release alone says enough
                kind = job_kind
                if not await store.insert_intervals(uow.conn, data, user=user, kind=kind,
                                                    granted_at=data.granted_at, released_at=data.released_at,
                                                    reason=data.reason, idle_util_pct=self.idle_pct):
                    # the grant was being applied by another replica's batch, which has now committed: close it
                    kind = await store.interval_kind(uow.conn, data.allocation_id) or job_kind
                    await store.close_intervals(uow.conn, data.allocation_id, data.released_at, data.reason,
                                                self.idle_pct)
            else:
                await store.close_intervals(uow.conn, data.allocation_id, data.released_at, data.reason,
                                            self.idle_pct)
            if not await store.record_usage(uow.conn, data, model=model, user=user, kind=kind,
                                            share_milli=share_milli(data), milli_us=milli_us):
                return
            await uow.emit(UsageRecorded(
                allocation_id=data.allocation_id, job_id=data.job_id, team=data.team, project=data.project,
                gpu_model=model, gpu_count=len(data.gpus), gpu_seconds=milli_us / 1e9, started_at=data.granted_at,
                ended_at=data.released_at, gpu_share=share_milli(data) / MILLI, user=user, kind=kind,
                sharing=allocation_sharing(data), release_reason=data.reason))
        log.info("usage_recorded", extra={"allocation_id": data.allocation_id, "team": data.team,
                                          "gpu_seconds": round(milli_us / 1e9, 3)})

    # --- utilization from inventory's rollups --------------------------------------------------------------------
    async def on_rollup(self, event: CloudEvent, data: EventData) -> None:
        """No inbox: each GPU's rollup is stored under (gpu, window start) and added to intervals only when first
        stored, so a redelivered rollup changes nothing."""
        if not isinstance(data, TelemetryRolledUp):
            raise Poison("UnsupportedEventType", f"{event.type} is not a telemetry rollup")
        if data.window_end <= data.window_start:
            raise Poison("InvalidRollup", "window_end must be after window_start")
        async with self.rt.uow() as uow:
            await store.lock_node(uow.conn, data.cluster, data.node)  # its one lock, taken first
            for gpu in data.gpus:
                await store.apply_rollup(uow.conn, cluster=data.cluster, node=data.node,
                                         window_start=data.window_start, window_end=data.window_end, gpu=gpu,
                                         idle_util_pct=self.idle_pct)

    async def prune_loop(self) -> None:
        while True:
            await asyncio.sleep(self.settings.prune_interval_s)
            try:
                async with self.rt.pool.acquire() as conn:
                    before = utcnow() - timedelta(days=self.settings.rollup_retention_days)
                    pruned = await store.prune_rollups(conn, before)
                if pruned:
                    log.info("rollups_pruned", extra={"rows": pruned})
            except Exception as exc:  # the database may be briefly away: try again next time
                log.warning("rollup_prune_failed", extra={"error": repr(exc)})

    # --- supply and orphans ------------------------------------------------------------------------------------------
    async def _supply_change(self, event: CloudEvent, at: datetime, change: Any) -> None:
        async with self.rt.uow() as uow:
            await change(uow.conn)
            await store.note_supply(uow.conn, at)

    async def on_node_registered(self, event: CloudEvent, data: NodeRegistered) -> None:
        await self._supply_change(event, data.registered_at, lambda c: store.register_node(c, data))

    async def on_node_lost(self, event: CloudEvent, data: NodeLost) -> None:
        await self._supply_change(event, data.detected_at,
                                  lambda c: store.set_node_lost(c, data.cluster, data.node, True))

    async def on_node_recovered(self, event: CloudEvent, data: NodeRecovered) -> None:
        await self._supply_change(event, data.recovered_at,
                                  lambda c: store.set_node_lost(c, data.cluster, data.node, False))

    async def on_gpu_health_changed(self, event: CloudEvent, data: GpuHealthChanged) -> None:
        await self._supply_change(event, data.observed_at,
                                  lambda c: store.set_gpu_health(c, data.gpu_uuid, data.current))

    async def on_orphan_detected(self, event: CloudEvent, data: OrphanDetected) -> None:
        async with self.rt.uow() as uow:
            await store.note_orphan(uow.conn, gpu_uuid=data.gpu_uuid, orphan=data.orphan,
                                    allocation_id=data.allocation_id, job_id=data.job_id, team=data.team,
                                    cluster=data.cluster, node=data.node, pids=data.pids, since=data.since,
                                    detected_at=data.detected_at)

    # --- cost rates ------------------------------------------------------------------------------------------------
    async def set_cost_rate(self, cmd: SetCostRate) -> Reply:
        now = utcnow()
        key = f"{cmd.gpu_model}{'/' + cmd.mig_profile if cmd.mig_profile else ''}@{cmd.effective_from.isoformat()}"
        async with self.rt.uow() as uow:
            before = await store.get_rate(uow.conn, cmd.gpu_model, cmd.mig_profile, cmd.effective_from)
            if cmd.delete:
                if before is None:
                    return Reply.failure(404, "CostRateNotFound", f"no price {key}")
                await store.delete_rate(uow.conn, cmd.gpu_model, cmd.mig_profile, cmd.effective_from)
                after = None
            else:
                assert cmd.price_per_hour is not None
                after = await store.put_rate(uow.conn, cmd.gpu_model, cmd.mig_profile, cmd.effective_from,
                                             cmd.price_per_hour, cmd.set_by, now)
            await uow.emit(CostRateSet(
                rate_key=key, gpu_model=cmd.gpu_model, mig_profile=cmd.mig_profile,
                effective_from=cmd.effective_from, price_per_hour=None if cmd.delete else cmd.price_per_hour,
                currency=self.settings.currency, deleted=cmd.delete, set_by=cmd.set_by, set_at=now))
        return Reply.success({"before": _rate_view(before) if before else None,
                              "after": _rate_view(after) if after else None, "currency": self.settings.currency})

    async def list_cost_rates(self, cmd: ListCostRates) -> Reply:
        async with self.rt.pool.acquire() as conn:
            rows = await store.list_rates(conn, cmd.gpu_model)
        return Reply.success({"items": [_rate_view(r) for r in rows], "next": None,
                              "currency": self.settings.currency})

    async def _rates(self, conn: Any) -> list[Rate]:
        return [Rate(r["gpu_model"], r["mig_profile"], r["effective_from"], Decimal(r["price_per_hour"]))
                for r in await store.list_rates(conn)]

    # --- reports ---------------------------------------------------------------------------------------------------
    def _frame(self, cmd: Any, as_of: datetime) -> dict[str, Any]:
        return {"start": cmd.start.isoformat(), "end": cmd.end.isoformat(), "as_of": as_of.isoformat(),
                "currency": self.settings.currency, "idle_util_pct": self.idle_pct}

    async def _grouped(self, cmd: UsageReportQuery) -> tuple[datetime, dict[tuple, Totals], dict[tuple, Any]]:
        as_of = min(cmd.end, utcnow())
        filters = {k: list(v) for k, v in cmd.filters.items()}
        if as_of <= cmd.start:
            return as_of, {}, {}
        async with self.rt.pool.acquire() as conn:
            rates = await self._rates(conn)
            bounds = segment_bounds(cmd.start, as_of, rates)
            pieces = await store.usage_pieces(conn, bounds=bounds, as_of=as_of, group_by=cmd.group_by,
                                              filters=filters)
            counts = await store.allocation_counts(conn, start=cmd.start, as_of=as_of, group_by=cmd.group_by,
                                                   filters=filters)
        folded = fold_pieces((dict(p) for p in pieces), cmd.group_by, bounds, rates)
        return as_of, folded, {tuple(c[d] for d in cmd.group_by): c for c in counts}

    def _rows(self, cmd: UsageReportQuery, folded: dict[tuple, Totals], counts: dict[tuple, Any],
              render: Any) -> dict[str, Any]:
        rows = []
        for key, totals in folded.items():
            c = counts.get(key)
            rows.append({**dict(zip(cmd.group_by, key, strict=True)), **render(totals),
                         "allocations": c["allocations"] if c else 0, "jobs": c["jobs"] if c else 0})
        rows.sort(key=lambda r: (-folded[tuple(r[d] for d in cmd.group_by)].milli_us,
                                 tuple(str(r[d]) for d in cmd.group_by)))
        total = Totals()
        for t in folded.values():
            total.add(t)
        return {"group_by": list(cmd.group_by), "filters": cmd.filters, "rows": rows[:cmd.limit],
                "truncated": len(rows) > cmd.limit,
                "total": render(total)}

    async def report_usage(self, cmd: UsageReportQuery) -> Reply:
        as_of, folded, counts = await self._grouped(cmd)
        return Reply.success({**self._frame(cmd, as_of), **self._rows(cmd, folded, counts, usage_row)})

    async def report_efficiency(self, cmd: EfficiencyReportQuery) -> Reply:
        as_of, folded, counts = await self._grouped(cmd)
        return Reply.success({**self._frame(cmd, as_of), **self._rows(cmd, folded, counts, efficiency_row)})

    async def report_waste(self, cmd: WasteReportQuery) -> Reply:
        by_team = UsageReportQuery(start=cmd.start, end=cmd.end, filters=cmd.filters, group_by=["team"],
                                   limit=10_000)
        as_of, folded, counts = await self._grouped(by_team)
        filters = {k: list(v) for k, v in cmd.filters.items()}
        async with self.rt.pool.acquire() as conn:
            idle = await store.idle_allocations(conn, start=cmd.start, as_of=as_of, filters=filters,
                                                min_idle_fraction=cmd.min_idle_fraction, limit=cmd.limit) \
                if as_of > cmd.start else []
            teams = cmd.filters.get("team")
            orphans = await store.orphans_between(conn, cmd.start, cmd.end, teams, cmd.limit)
        teams_rows = sorted(({"team": k[0], **efficiency_row(t)} for k, t in folded.items()),
                            key=lambda r: (-r["idle_gpu_hours"], r["team"]))
        total = Totals()
        for t in folded.values():
            total.add(t)
        allocations = [{
            "allocation_id": r["allocation_id"], "job_id": r["job_id"], "team": r["team"], "project": r["project"],
            "user": r["user"], "kind": r["kind"], "cluster": r["cluster"], "node": r["node"],
            "gpu_model": r["gpu_model"], "gpus": r["gpus"], "gpu_share": r["share_milli"] / MILLI,
            "granted_at": _iso(r["granted_at"]), "released_at": None if r["running"] else _iso(r["released_at"]),
            "running": r["running"], "release_reason": r["release_reason"],
            "gpu_hours": round(float(r["milli_us"]) / (MILLI * US_PER_HOUR), 6),
            "idle_gpu_hours": round(float(r["idle_milli_us"]) / (MILLI * US_PER_HOUR), 6),
            "idle_fraction": round(float(r["idle_milli_us"]) / float(r["measured_milli_us"]), 4),
            "avg_utilization_pct": round(float(r["avg_utilization_pct"]), 3)} for r in idle]
        orphan_rows = [{
            "gpu_uuid": o["gpu_uuid"], "orphan": o["orphan"], "allocation_id": o["allocation_id"],
            "job_id": o["job_id"], "team": o["team"], "cluster": o["cluster"], "node": o["node"],
            "pids": list(o["pids"]), "since": _iso(o["since"]), "first_detected_at": _iso(o["first_detected_at"]),
            "last_detected_at": _iso(o["last_detected_at"]), "reports": o["reports"]} for o in orphans]
        return Reply.success({
            **self._frame(cmd, as_of), "filters": cmd.filters, "min_idle_fraction": cmd.min_idle_fraction,
            "idle_gpu_hours": efficiency_row(total)["idle_gpu_hours"], "by_team": teams_rows,
            "idle_allocations": allocations, "orphans": orphan_rows})

    async def report_capacity(self, cmd: CapacityReportQuery) -> Reply:
        now = utcnow()
        as_of = min(cmd.end, now)
        span_s = max(0.0, (as_of - cmd.start).total_seconds())
        n_buckets = max(1, math.ceil(span_s / cmd.bucket_s)) if span_s > 0 else 0
        starts = [cmd.start + timedelta(seconds=i * cmd.bucket_s) for i in range(n_buckets)]
        async with self.rt.pool.acquire() as conn:
            supply = await store.supply_now(conn)
            history = await store.supply_history(conn, as_of)
            if n_buckets:
                levels = await store.demand_levels(conn, start=cmd.start, end=cmd.end, as_of=as_of,
                                                   bucket_s=cmd.bucket_s, n_buckets=n_buckets, team=cmd.team,
                                                   gpu_model=cmd.gpu_model)
                held = await store.held_by_model(conn, start=cmd.start, as_of=as_of, team=cmd.team,
                                                 gpu_model=cmd.gpu_model)
            else:
                levels, held = [], {}
            waits = {w["gpu_model"]: w for w in await store.wait_stats(
                conn, start=cmd.start, end=cmd.end, as_of=as_of, team=cmd.team, gpu_model=cmd.gpu_model)}
        by_src: dict[tuple[str, str], list[BucketLevels]] = {}
        for r in levels:
            by_src.setdefault((r["model"], r["src"]), []).append(
                BucketLevels(r["bucket"], r["max_level"] / MILLI, r["last_level"] / MILLI, r["first_t"]))
        models = set(supply) | {m for m, _ in by_src} | set(waits) | set(held)
        if cmd.gpu_model:
            models &= {cmd.gpu_model}
        total_supply = sum(supply.values())
        out = []
        for model in sorted(models):
            model_supply = total_supply if model == "any" else supply.get(model, 0)
            demand_peaks = bucket_peaks(by_src.get((model, "demand"), []), n_buckets, starts)
            held_peaks = bucket_peaks(by_src.get((model, "held"), []), n_buckets, starts)
            trend = []
            for i, b_start in enumerate(starts):
                b_end = min(b_start + timedelta(seconds=cmd.bucket_s), as_of)
                trend.append({"start": b_start.isoformat(), "peak_demand_gpus": demand_peaks[i],
                              "peak_allocated_gpus": held_peaks[i],
                              "supply_gpus": _supply_at(history, model, b_end, total=model == "any")})
            # Buckets before the fleet or any demand was known (e.g. before the platform ran) say nothing.
            # A last bucket shorter than half a bucket (the range does not divide evenly) is too thin to weigh.
            known = [i for i in range(n_buckets) if trend[i]["supply_gpus"] or demand_peaks[i]]
            last = n_buckets - 1 if n_buckets > 1 and span_s - (n_buckets - 1) * cmd.bucket_s < cmd.bucket_s / 2 \
                else n_buckets
            points = [((starts[i] - cmd.start).total_seconds() + min(cmd.bucket_s, span_s - i * cmd.bucket_s) / 2,
                       demand_peaks[i]) for i in range(known[0] if known else n_buckets, last)]
            forecast = _forecast_view(points, model_supply, span_s, cmd)
            w = waits.get(model)
            pcts = list(w["wait_pcts"]) if w is not None and w["wait_pcts"] is not None else [None, None, None]
            allocated_hours = held.get(model, 0) / (MILLI * US_PER_HOUR)
            out.append({
                "gpu_model": model, "supply_gpus": model_supply,
                "demand": {
                    "queued_gpu_hours": round(float(w["queued_milli_us"]) / (MILLI * US_PER_HOUR), 6) if w else 0.0,
                    "pending_gpus": float(w["pending_milli"]) / MILLI if w else 0.0,
                    "waits": w["granted"] if w else 0,
                    "wait_p50_s": _round(pcts[0]), "wait_p90_s": _round(pcts[1]), "wait_p99_s": _round(pcts[2]),
                    "wait_max_s": _round(w["wait_max"]) if w else None,
                    "peak_demand_gpus": max(demand_peaks, default=0.0),
                    "peak_allocated_gpus": max(held_peaks, default=0.0),
                    "allocated_gpu_hours": round(allocated_hours, 6)},
                "allocated_pct_of_supply": round(100 * allocated_hours / (model_supply * span_s / 3600), 3)
                if model_supply and span_s else None,
                "trend": trend,
                "forecast": forecast})
        return Reply.success({"start": cmd.start.isoformat(), "end": cmd.end.isoformat(), "as_of": as_of.isoformat(),
                              "bucket_s": cmd.bucket_s, "team": cmd.team, "models": out})

    async def export_history(self, cmd: HistoryQuery) -> Reply:
        """A page of recorded jobs (what each asked for, when it entered the queue, started and ended): the input
        of `gpupool history export`, which writes them as a trace the simulator replays."""
        as_of = min(cmd.end, utcnow())
        async with self.rt.pool.acquire() as conn:
            rows = await store.history_jobs(conn, start=cmd.start, end=cmd.end, as_of=as_of, teams=cmd.teams,
                                            after=cmd.after, limit=cmd.limit + 1)
        items = [history_item(dict(r)) for r in rows[:cmd.limit]]
        return Reply.success({"start": cmd.start.isoformat(), "end": cmd.end.isoformat(), "as_of": as_of.isoformat(),
                              "items": items, "next": items[-1]["job_id"] if len(rows) > cmd.limit else None})

    async def utilization(self, cmd: UtilizationQuery) -> Reply:
        """The utilization history of one job's GPUs (or every GPU one team held), bucketed, from the one-minute
        rollups stored here (kept ROLLUP_RETENTION_DAYS)."""
        as_of = min(cmd.end, utcnow())
        rows: list[Any] = []
        if as_of > cmd.start:
            async with self.rt.pool.acquire() as conn:
                rows = await store.utilization_buckets(conn, job_id=cmd.job_id, team=cmd.team, start=cmd.start,
                                                       as_of=as_of, step_s=cmd.step_s, idle_util_pct=self.idle_pct)
        return Reply.success({"start": cmd.start.isoformat(), "end": cmd.end.isoformat(), "as_of": as_of.isoformat(),
                              "step_s": cmd.step_s, "job_id": cmd.job_id, "team": cmd.team,
                              "idle_util_pct": self.idle_pct,
                              **utilization_series((dict(r) for r in rows), cmd.start, as_of, cmd.step_s)})

    # --- ledger list -------------------------------------------------------------------------------------------------
    async def list_usage(self, cmd: ListUsage) -> Reply:
        async with self.rt.pool.acquire() as conn:
            rows = await store.list_usage(conn, team=cmd.team, job_id=cmd.job_id, limit=cmd.limit + 1,
                                          after=cmd.after)
        return Reply.success(page(
            rows, cmd.limit,
            lambda r: {**dict(r), "gpu_share": float(r["gpu_share"]), "started_at": r["started_at"].isoformat(),
                       "ended_at": r["ended_at"].isoformat()},
            lambda item: item["allocation_id"]))


def _round(value: Any, digits: int = 3) -> float | None:
    return None if value is None else round(float(value), digits)


FORECAST_METHOD = ("least squares through each bucket's peak demand: a linear trend, plus day-of-week terms with "
                   "at least 14 days of data; status from the trend line against supply")


def _forecast_view(points: list[tuple[float, float]], supply: int, span_s: float,
                   cmd: CapacityReportQuery) -> dict[str, Any]:
    """The report's forecast of one model: status and crossing from the trend line (linear_forecast), the numbers
    (slope, level, next 7 and 30 days with an interval, weekly pattern) from demand_forecast."""
    line = linear_forecast(points, supply, span_s)
    at = cmd.start.timestamp()
    fit = demand_forecast([(at + x, y) for x, y in points], step_s=cmd.bucket_s)
    slope = fit["slope_gpus_per_day"] if fit["slope_gpus_per_day"] is not None else line["slope_per_day"]
    return {"method": FORECAST_METHOD, "status": line["status"], "fit": fit["model"], "points": fit["points"],
            "slope_gpus_per_day": _round(slope, 6), "level_gpus": fit["level_gpus"],
            "residual_sd_gpus": fit["residual_sd_gpus"], "weekly_gpus": fit["weekly_gpus"],
            "next": fit["horizons"],
            "exceeds_supply_at": (cmd.start + timedelta(seconds=line["exceeds_at_s"])).isoformat()
            if line["exceeds_at_s"] is not None else None}


def _supply_at(history: list[Any], model: str, at: datetime, *, total: bool) -> int:
    """GPUs of a model (or of every model) per the last supply change at or before `at`."""
    latest: dict[str, int] = {}
    for h in history:
        if h["at"] > at:
            break
        latest[h["gpu_model"]] = h["gpus"]
    return sum(latest.values()) if total else latest.get(model, 0)


def routes(h: AccountingHandlers) -> Routes:
    return Routes(
        inbox=CONSUMER,
        commands={
            subjects.QUERY_ACCOUNTING_LIST_USAGE: (ListUsage, h.list_usage),
            subjects.QUERY_ACCOUNTING_REPORT_USAGE: (UsageReportQuery, h.report_usage),
            subjects.QUERY_ACCOUNTING_REPORT_EFFICIENCY: (EfficiencyReportQuery, h.report_efficiency),
            subjects.QUERY_ACCOUNTING_REPORT_CAPACITY: (CapacityReportQuery, h.report_capacity),
            subjects.QUERY_ACCOUNTING_REPORT_WASTE: (WasteReportQuery, h.report_waste),
            subjects.QUERY_ACCOUNTING_EXPORT_HISTORY: (HistoryQuery, h.export_history),
            subjects.QUERY_ACCOUNTING_UTILIZATION: (UtilizationQuery, h.utilization),
            subjects.QUERY_ACCOUNTING_COST_RATES: (ListCostRates, h.list_cost_rates),
            subjects.CMD_ACCOUNTING_SET_COST_RATE: (SetCostRate, h.set_cost_rate),
        },
        events={
            JobSubmitted: once(h.on_job_submitted),
            JobCancelled: once(h.on_job_cancelled),
            AllocationGranted: once(h.on_allocation_granted),
            AllocationReleased: once(h.on_allocation_released),
            NodeRegistered: once(h.on_node_registered),
            NodeLost: once(h.on_node_lost),
            NodeRecovered: once(h.on_node_recovered),
            GpuHealthChanged: once(h.on_gpu_health_changed),
            OrphanDetected: once(h.on_orphan_detected),
        },
        # every event handler is one unit of work and nothing else: safe to apply a fetched batch in one
        # transaction (README: "Batched event handling"; the rollup consumer stays one message per transaction)
        batched=True,
    )

