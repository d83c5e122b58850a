"""Accounting rules, pure: how an allocation becomes GPU-seconds, how prices apply, how demand is trended.

Time is counted in whole microseconds (what the allocation events and PostgreSQL both carry) and shares in milli-GPU,
so every ledger sum is an integer sum and exact; only the final presentation divides.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal

from libs.contracts.events import AllocatedGpu, AllocationEvent, AllocationReleased, JobSubmitted

US_PER_S = 1_000_000
MILLI = 1000
US_PER_HOUR = 3600 * US_PER_S
_ONE_US = timedelta(microseconds=1)
_MIG_SLICES = re.compile(r"^([1-7])g\.")


def held_us(start: datetime, end: datetime) -> int:
    """Whole microseconds from start to end; a clock skew that would make it negative counts as zero."""
    return max(0, (end - start) // _ONE_US)


def sharing_of(gpu: AllocatedGpu) -> str:
    if gpu.mig_profile:
        return "mig"
    return "whole" if gpu.share_milli >= MILLI else "fraction"


def share_milli(data: AllocationEvent) -> int:
    """GPUs held, each counted by its share, in milli-GPU (a whole GPU is 1000)."""
    return sum(g.share_milli for g in data.gpus)


def gpu_milli_us(data: AllocationReleased) -> int:
    """(release − grant) × Σ share, in milli-GPU-microseconds: the exact size of one ledger row."""
    return held_us(data.granted_at, data.released_at) * share_milli(data)


def gpu_seconds(data: AllocationReleased) -> float:
    return gpu_milli_us(data) / (MILLI * US_PER_S)


def dominant_model(data: AllocationEvent) -> str:
    """The model an allocation is charged as (allocations are single-model today; the most common wins)."""
    return Counter(g.model for g in data.gpus).most_common(1)[0][0] if data.gpus else "unknown"


def allocation_sharing(data: AllocationEvent) -> str:
    kinds = {sharing_of(g) for g in data.gpus}
    return kinds.pop() if len(kinds) == 1 else ("whole" if not kinds else "mixed")


def mig_share_milli(profile: str) -> int:
    """A MIG slice's share of its GPU: compute slices / 7 (the same rule placement applies)."""
    match = _MIG_SLICES.match(profile)
    return round(int(match.group(1)) * MILLI / 7) if match else MILLI


def demand_milli(data: JobSubmitted) -> int:
    """GPUs a queued job asks for, by share: a gang's total, each replica's GPUs, a fraction or a MIG slice."""
    copies = 1 if data.gang_nodes else max(1, data.replicas)
    if data.mig_profile:
        return mig_share_milli(data.mig_profile) * copies
    if data.gpu_fraction_milli:
        return data.gpu_fraction_milli * copies
    return data.gpus * MILLI * copies


def requested_model(data: JobSubmitted) -> str:
    """The model a waiting job's demand counts against: the one it asks for, or `any`."""
    return data.gpu_models[0] if len(data.gpu_models) == 1 else "any"


# --- utilization from rollups -------------------------------------------------------------------------------------
def utilization(covered_us: float, util_us: float, idle_us: float) -> tuple[float | None, float | None]:
    """(average utilization %, idle fraction) over the covered part of an interval; None without coverage."""
    if covered_us <= 0:
        return None, None
    return util_us / covered_us, idle_us / covered_us


# --- cost ----------------------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Rate:
    gpu_model: str
    mig_profile: str
    effective_from: datetime
    price_per_hour: Decimal


def segment_bounds(start: datetime, end: datetime, rates: Iterable[Rate]) -> list[tuple[datetime, datetime]]:
    """[start, end) cut wherever a price takes effect, so every price is constant within one segment."""
    cuts = sorted({r.effective_from for r in rates if start < r.effective_from < end})
    points = [start, *cuts, end]
    return list(zip(points[:-1], points[1:], strict=True))


def rate_in_force(rates: Sequence[Rate], gpu_model: str, mig_profile: str, at: datetime) -> Rate | None:
    best: Rate | None = None
    for r in rates:
        if r.gpu_model == gpu_model and r.mig_profile == mig_profile and r.effective_from <= at:
            if best is None or r.effective_from > best.effective_from:
                best = r
    return best


def piece_cost(rates: Sequence[Rate], gpu_model: str, mig_profile: str, at: datetime, inst_us: int,
               milli_us: int) -> Decimal | None:
    """Cost of GPU time of one model (and MIG profile) within one price segment starting at `at`.

    A MIG slice pays its profile's instance-hour price when one is in force, else its share of the model's GPU-hour
    price; a fraction pays its share of the GPU-hour price. None: no price in force (the time stays unpriced)."""
    if mig_profile:
        rate = rate_in_force(rates, gpu_model, mig_profile, at)
        if rate is not None:
            return Decimal(inst_us) * rate.price_per_hour / US_PER_HOUR
    rate = rate_in_force(rates, gpu_model, "", at)
    if rate is None:
        return None
    return Decimal(milli_us) * rate.price_per_hour / (US_PER_HOUR * MILLI)


def money(value: Decimal) -> float:
    return float(value.quantize(Decimal("0.000001")))


def gpu_seconds_of(milli_us: int | Decimal) -> float:
    """milli-GPU-µs as GPU-seconds, exact to the microsecond."""
    return float((Decimal(milli_us) / (MILLI * US_PER_S)).quantize(Decimal("0.000001")))


# --- capacity ------------------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class BucketLevels:
    """Within one trend bucket, from the running level of held (or demanded) GPUs: the highest level reached after
    an event in the bucket, the level after its last event, and the time of its first event."""

    bucket: int
    max_level: float
    last_level: float
    first_event_at: datetime


def bucket_peaks(levels: Sequence[BucketLevels], n_buckets: int, bucket_starts: Sequence[datetime]) -> list[float]:
    """Peak level per bucket, carrying the level across buckets without events. A bucket whose first event is
    after its start also sees the level carried in (held since before it began)."""
    by_bucket = {b.bucket: b for b in levels}
    peaks, carry = [], 0.0
    for i in range(n_buckets):
        b = by_bucket.get(i)
        if b is None:
            peaks.append(carry)
            continue
        peak = b.max_level
        if b.first_event_at > bucket_starts[i]:
            peak = max(peak, carry)
        peaks.append(peak)
        carry = b.last_level
    return peaks


def linear_forecast(points: Sequence[tuple[float, float]], supply: float, now_s: float) -> dict:
    """Least-squares line through (time s, peak demand) points and when it reaches `supply`.

    status: `exceeds` (the latest peak is already above supply), `will_exceed` (rising; `exceeds_at_s` when the
    line crosses supply), `ok` (flat or falling, below supply), `insufficient_data` (fewer than two points)."""
    if len(points) < 2 or len({x for x, _ in points}) < 2:
        latest = points[-1][1] if points else 0.0
        return {"status": "exceeds" if latest > supply else "insufficient_data", "slope_per_day": None,
                "exceeds_at_s": None}
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    slope = sum((x - mx) * (y - my) for x, y in points) / sxx
    intercept = my - slope * mx
    latest = points[-1][1]
    out = {"slope_per_day": slope * 86400, "intercept": intercept, "exceeds_at_s": None}
    if latest > supply:
        return {**out, "status": "exceeds"}
    if slope <= 0 or math.isclose(slope, 0.0, abs_tol=1e-12):
        return {**out, "status": "ok"}
    crossing = (supply - intercept) / slope
    return {**out, "status": "will_exceed", "exceeds_at_s": max(crossing, now_s)}


# --- folding report pieces ------------------------------------------------------------------------------------------
@dataclass(slots=True)
class Totals:
    """GPU time of one report group. `milli_us` is exact; the utilization-weighted parts are estimates (each
    interval's average over its measured time applied to its part inside the range)."""

    milli_us: int = 0
    measured_milli_us: float = 0.0
    used_milli_us: float = 0.0
    idle_milli_us: float = 0.0
    cost: Decimal = Decimal(0)
    unpriced_milli_us: int = 0

    def add(self, other: Totals) -> None:
        self.milli_us += other.milli_us
        self.measured_milli_us += other.measured_milli_us
        self.used_milli_us += other.used_milli_us
        self.idle_milli_us += other.idle_milli_us
        self.cost += other.cost
        self.unpriced_milli_us += other.unpriced_milli_us


def fold_pieces(pieces: Iterable[dict], group_by: Sequence[str], bounds: Sequence[tuple[datetime, datetime]],
                rates: Sequence[Rate]) -> dict[tuple, Totals]:
    """Sum pieces (group × model × MIG profile × price segment) into groups, pricing each piece with the price in
    force in its segment."""
    out: dict[tuple, Totals] = {}
    for p in pieces:
        key = tuple(p[d] for d in group_by)
        milli_us, inst_us = int(p["milli_us"]), int(p["inst_us"])
        cost = piece_cost(rates, p["_model"], p["_profile"], bounds[p["_seg"]][0], inst_us, milli_us)
        t = Totals(milli_us=milli_us, measured_milli_us=float(p["measured_milli_us"]),
                   used_milli_us=float(p["used_milli_us"]), idle_milli_us=float(p["idle_milli_us"]),
                   cost=cost if cost is not None else Decimal(0), unpriced_milli_us=0 if cost is not None else milli_us)
        out.setdefault(key, Totals()).add(t)
    return out


def _hours(milli_us: float) -> float:
    return round(milli_us / (MILLI * US_PER_HOUR), 6)


def _pct(part: float, whole: float) -> float | None:
    return round(100.0 * part / whole, 3) if whole > 0 else None


def usage_row(t: Totals) -> dict:
    return {"gpu_seconds": gpu_seconds_of(t.milli_us), "gpu_hours": _hours(t.milli_us), "cost": money(t.cost),
            "unpriced_gpu_seconds": gpu_seconds_of(t.unpriced_milli_us),
            "avg_utilization_pct": _pct(t.used_milli_us, t.measured_milli_us)}


def efficiency_row(t: Totals) -> dict:
    return {"allocated_gpu_hours": _hours(t.milli_us), "measured_gpu_hours": _hours(t.measured_milli_us),
            "used_gpu_hours": _hours(t.used_milli_us), "idle_gpu_hours": _hours(t.idle_milli_us),
            "efficiency_pct": _pct(t.used_milli_us, t.measured_milli_us),
            "idle_pct": _pct(t.idle_milli_us, t.measured_milli_us),
            "telemetry_coverage_pct": _pct(t.measured_milli_us, t.milli_us)}


# --- demand forecast: linear trend + weekly season ---------------------------------------------------------------
FORECAST_MIN_POINTS = 3  # fewer: `insufficient_data` (a line through two points has no residual to size an interval)
SEASON_MIN_DAYS = 14  # at least two of every weekday before day-of-week terms are fitted
FORECAST_Z = 1.2816  # the interval: ±z × the residual standard deviation, an 80% band for normal errors
FORECAST_STEP_S = 3600.0  # the future is evaluated at the bucket step, or hourly for shorter buckets
WEEKDAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
_DAY_S = 86_400.0


def weekday_of(epoch_s: float) -> int:
    """0 = Monday … 6 = Sunday, in UTC (1970-01-01 was a Thursday)."""
    return (int(epoch_s // _DAY_S) + 3) % 7


def _solve(a: list[list[float]], b: list[float]) -> list[float] | None:
    """Gaussian elimination with partial pivoting; None when the system is singular."""
    n = len(b)
    m = [row[:] + [b[i]] for i, row in enumerate(a)]
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(m[r][col]))
        if abs(m[pivot][col]) < 1e-12:
            return None
        m[col], m[pivot] = m[pivot], m[col]
        for r in range(col + 1, n):
            f = m[r][col] / m[col][col]
            for c in range(col, n + 1):
                m[r][c] -= f * m[col][c]
    x = [0.0] * n
    for r in range(n - 1, -1, -1):
        x[r] = (m[r][n] - sum(m[r][c] * x[c] for c in range(r + 1, n))) / m[r][r]
    return x


def _least_squares(rows: list[list[float]], ys: Sequence[float]) -> list[float] | None:
    k = len(rows[0])
    ata = [[sum(r[i] * r[j] for r in rows) for j in range(k)] for i in range(k)]
    aty = [sum(r[i] * y for r, y in zip(rows, ys, strict=True)) for i in range(k)]
    return _solve(ata, aty)


def _design(t_days: float, weekday: int, seasonal: bool) -> list[float]:
    """Intercept, trend, and (seasonal) six weekday terms coded to sum to zero over the week (Sunday = minus the
    others), so intercept + trend is the weekly average and the day terms are deviations from it."""
    row = [1.0, t_days]
    if seasonal:
        row += [-1.0 if weekday == 6 else (1.0 if weekday == d else 0.0) for d in range(6)]
    return row


def demand_forecast(points: Sequence[tuple[float, float]], *, step_s: float,
                    horizons_days: Sequence[int] = (7, 30)) -> dict:
    """Forecast GPU demand from evenly spaced (epoch seconds, GPUs) points (e.g. each day's peak demand).

    Least squares of a linear trend, plus day-of-week terms when the points span at least SEASON_MIN_DAYS and every
    weekday occurs at least twice (`trend+weekly`), else the trend alone (`trend`); `insufficient_data` with fewer
    than FORECAST_MIN_POINTS points or a single instant. For each horizon H: the forecast at every step of the next
    H days (the bucket step, or hourly for shorter buckets), their mean and peak, and the peak's interval
    ±FORECAST_Z × the residual standard deviation (an 80% band for normal errors); demand is never negative."""
    pts = sorted(points)
    base = {"model": "insufficient_data", "points": len(pts), "slope_gpus_per_day": None, "level_gpus": None,
            "residual_sd_gpus": None, "weekly_gpus": None,
            "horizons": [{"days": h, "mean_gpus": None, "peak_gpus": None, "peak_low_gpus": None,
                          "peak_high_gpus": None} for h in horizons_days]}
    if len(pts) < FORECAST_MIN_POINTS or pts[-1][0] <= pts[0][0] or step_s <= 0:
        return base
    t0 = pts[0][0]
    days = [(t - t0) / _DAY_S for t, _ in pts]
    ys = [y for _, y in pts]
    counts = Counter(weekday_of(t) for t, _ in pts)
    seasonal = days[-1] + step_s / _DAY_S >= SEASON_MIN_DAYS and len(counts) == 7 and min(counts.values()) >= 2
    coef = _least_squares([_design(d, weekday_of(t), seasonal) for d, (t, _) in zip(days, pts, strict=True)], ys)
    if coef is None and seasonal:
        seasonal = False
        coef = _least_squares([_design(d, 0, False) for d in days], ys)
    if coef is None:
        return base

    def fitted(t: float) -> float:
        return sum(c * x for c, x in zip(coef, _design((t - t0) / _DAY_S, weekday_of(t), seasonal), strict=True))

    sse = sum((y - fitted(t)) ** 2 for t, y in pts)
    dof = len(pts) - len(coef)
    sd = math.sqrt(sse / dof) if dof > 0 else 0.0
    last = pts[-1][0]
    # the fit is a line plus one constant per weekday: hourly steps find its peak to within an hour's trend, and
    # bound the work (30 days of 1-second buckets would be 2.6 million evaluations)
    ahead = max(step_s, FORECAST_STEP_S)
    horizons = []
    for h in horizons_days:
        future = [max(0.0, fitted(last + i * ahead)) for i in range(1, max(1, int(h * _DAY_S // ahead)) + 1)]
        peak = max(future)
        horizons.append({"days": h, "mean_gpus": round(sum(future) / len(future), 3), "peak_gpus": round(peak, 3),
                         "peak_low_gpus": round(max(0.0, peak - FORECAST_Z * sd), 3),
                         "peak_high_gpus": round(peak + FORECAST_Z * sd, 3)})
    weekly = None
    if seasonal:
        terms = coef[2:]
        weekly = {WEEKDAYS[d]: round(terms[d] if d < 6 else -sum(terms), 3) for d in range(7)}
    return {"model": "trend+weekly" if seasonal else "trend", "points": len(pts),
            "slope_gpus_per_day": round(coef[1], 6), "level_gpus": round(max(0.0, fitted(last)), 3),
            "residual_sd_gpus": round(sd, 3), "weekly_gpus": weekly, "horizons": horizons}


# --- history export --------------------------------------------------------------------------------------------------
def _epoch(value: datetime | None) -> float | None:
    return round(value.timestamp(), 6) if value is not None else None


def history_item(r: dict) -> dict:
    """One recorded job as the history export shows it (`store.history_jobs` row in, JSON-ready dict out).

    The shape is what the job asked for (its JobSubmitted); for jobs recorded before accounting kept requests, what
    its last run held. `duration_s` is its last run, from that run's grant to its release (up to `as_of` while it
    runs: `state` running); `wait_s` from first entering the queue to the first grant. `state`: waiting (in the
    queue now), running, ended, or cancelled (never granted)."""
    granted = r["first_granted"] is not None
    slots, share = r["slots"] or 0, r["share_milli"] or 0
    held_fraction = share if granted and slots == 1 and share < MILLI and not r["held_mig_profile"] else 0
    gpus = r["gpus"] if r["gpus"] is not None else (max(1, share // MILLI) if granted else 0)
    if r["waiting"]:
        state = "waiting"
    elif granted:
        state = "running" if r["running"] else "ended"
    else:
        state = "cancelled"
    return {
        "job_id": r["job_id"], "name": r["name"], "team": r["team"], "project": r["project"],
        "user": r["user_name"], "kind": r["kind"], "priority": r["priority"] or 0,
        "priority_class": r["priority_class"] or "", "gpus": gpus, "gpu_models": list(r["gpu_models"] or []),
        "gpu_fraction_milli": r["gpu_fraction_milli"] if r["gpu_fraction_milli"] is not None else held_fraction,
        "mig_profile": r["mig_profile"] if r["mig_profile"] is not None else (r["held_mig_profile"] or ""),
        "gang_nodes": r["gang_nodes"] or 0, "gpus_per_node": r["gpus_per_node"] or 0,
        "replicas": r["replicas"] or 1, "max_runtime_s": r["max_runtime_s"],
        "submitted_at": r["entered_at"].isoformat(), "submit_time": _epoch(r["entered_at"]),
        "started_at": r["first_granted"].isoformat() if granted else None,
        "start_time": _epoch(r["first_granted"]),
        "ended_at": r["ended"].isoformat() if granted and not r["running"] else None,
        "end_time": _epoch(r["ended"]) if granted and not r["running"] else None,
        "duration_s": round(held_us(r["last_granted"], r["ended"]) / US_PER_S, 6) if granted else None,
        "wait_s": round(held_us(r["entered_at"], r["first_granted"]) / US_PER_S, 6) if granted else None,
        "gpu_model_granted": r["gpu_model"] if granted else None,
        "gpu_share": round(share / MILLI, 3) if granted else None, "nodes": r["nodes"] if granted else None,
        "state": state}


# --- utilization history -------------------------------------------------------------------------------------------
def utilization_series(rows: Iterable[dict], start: datetime, as_of: datetime, step_s: int) -> dict:
    """Every bucket of `step_s` from `start` up to `as_of`, from the per-bucket sums `store.utilization_buckets`
    returns (weights in µs × milli-GPU): the share-weighted mean utilization of the GPUs held, the busiest GPU
    minute, the idle share, and `gpus` (GPUs measured on average over the bucket, by share). A bucket without any
    measured minute has nulls and 0 GPUs: nothing was held, or its telemetry has not arrived yet."""
    span_us = held_us(start, as_of)
    step_us = step_s * US_PER_S
    n = math.ceil(span_us / step_us) if span_us > 0 else 0
    by_bucket = {int(r["bucket"]): r for r in rows}
    points = []
    weight = util_weight = idle_weight = 0.0
    peak: float | None = None
    for i in range(n):
        r = by_bucket.get(i)
        length_us = min(step_us, span_us - i * step_us)
        at = start + timedelta(microseconds=i * step_us)
        if r is None or not r["weight"]:
            points.append({"start": at.isoformat(), "utilization_pct": None, "max_utilization_pct": None,
                           "idle_pct": None, "gpus": 0.0, "allocations": 0})
            continue
        w = float(r["weight"])
        weight, util_weight, idle_weight = weight + w, util_weight + float(r["util_weight"]), \
            idle_weight + float(r["idle_weight"])
        peak = max(peak or 0.0, float(r["util_max"]))
        points.append({"start": at.isoformat(), "utilization_pct": round(float(r["util_weight"]) / w, 3),
                       "max_utilization_pct": round(float(r["util_max"]), 3),
                       "idle_pct": round(100 * float(r["idle_weight"]) / w, 3),
                       "gpus": round(w / (MILLI * length_us), 4), "allocations": int(r["allocations"])})
    return {"points": points,
            "avg_utilization_pct": round(util_weight / weight, 3) if weight else None,
            "max_utilization_pct": round(peak, 3) if peak is not None else None,
            "idle_pct": round(100 * idle_weight / weight, 3) if weight else None,
            "measured_gpu_hours": round(weight / (MILLI * US_PER_HOUR), 6)}
