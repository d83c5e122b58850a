"""`gpupool check`: read every store, then the streams, then judge. See libs/check/invariants.py for why the order
of the reads makes every comparison exact."""

from __future__ import annotations

import asyncio
import json
import re
import time
import urllib.request
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from libs.check import invariants, liveness
from libs.check.model import CHECKS, Report
from libs.check.snapshot import ServiceStore, Snapshot
from libs.check.stores import StoreUnavailable, jobs_exist, outbox_has, read_store
from libs.check.streams import StreamsUnavailable, read_streams

SERVICES = ("inventory", "quota", "queue", "placement", "reclamation", "accounting", "gateway")
# Downstream before upstream: accounting applies queue's and placement's events, queue applies placement's (and
# placement applies queue's, but the invariants between them only use facts that never revert).
READ_ORDER = ("accounting", "reclamation", "quota", "inventory", "gateway", "queue", "placement")


@dataclass
class CheckConfig:
    database_urls: dict[str, str] = field(default_factory=dict)  # service → DSN of its own database
    nats_url: str | None = None
    placement_metrics: list[str] = field(default_factory=list)  # /metrics URLs of placement's replicas
    outbox_max_age_s: float = 30.0
    lag_max_age_s: float = 60.0
    pending_max_age_s: float = 60.0  # a job the queue wants this long must be known to and considered by placement
    decision_max_age_s: float = 60.0  # placement must have decided since a job it wants this long was submitted
    telemetry_max_age_s: float = 60.0  # a ready node's newest stored GPU sample may be this old
    report_window_s: float = 15.0
    settle_s: float = 0.0  # retry a failing check for this long before reporting (0: judge once)
    only: set[str] | None = None
    # event ids a fault injector (`gpupool chaos`) put into the streams on purpose, forged or poison: not held
    # against the platform (their dead letters are still counted)
    injected: frozenset[str] = frozenset()

    @classmethod
    def from_run_file(cls, path: Path, **overrides) -> CheckConfig:  # type: ignore[no-untyped-def]
        doc = json.loads(Path(path).read_text())
        metrics = [url for name, url in (doc.get("metrics") or {}).items() if re.fullmatch(r"placement(-\d+)?", name)]
        return cls(database_urls=dict(doc.get("database_urls") or {}), nats_url=doc.get("nats_url"),
                   placement_metrics=metrics, **overrides)


def check(config: CheckConfig) -> Report:
    return asyncio.run(check_async(config))


async def check_async(config: CheckConfig) -> Report:
    deadline = time.monotonic() + config.settle_s
    while True:
        report = await _once(config)
        if report.ok or time.monotonic() >= deadline:
            return report
        await asyncio.sleep(min(1.0, max(0.0, deadline - time.monotonic())))


def _wanted(config: CheckConfig, name: str) -> bool:
    return config.only is None or name in config.only


async def _once(config: CheckConfig) -> Report:
    report = Report()
    # The leader's metric first: the placement snapshot read after it then holds every allocation it counted.
    reported, reported_at, reported_by = _reported_use(config) if _wanted(config, "quota_use") else (None, None, None)
    stores: dict[str, ServiceStore] = {}
    for service in sorted(config.database_urls, key=lambda s: READ_ORDER.index(s) if s in READ_ORDER else -1):
        try:
            stores[service] = await read_store(service, config.database_urls[service])
        except StoreUnavailable as exc:
            report.errors.append(str(exc))
    streams = None
    if config.nats_url:
        try:
            streams = await read_streams(config.nats_url)
        except StreamsUnavailable as exc:
            report.errors.append(str(exc))
        if streams is not None and config.injected:
            streams.events = [e for e in streams.events if e.event_id not in config.injected]
    snapshot = Snapshot(stores=stores, streams=streams, reported_quota_use=reported, reported_at=reported_at,
                        reported_by=reported_by)
    foreign = await _foreign_events(config, snapshot) if streams is not None else {}
    _judge(config, snapshot, report, foreign)
    await _second_look(config, report)
    return report


async def _second_look(config: CheckConfig, report: Report) -> None:
    """Placement is read after the queue, so a job submitted in between is placed but not yet in the queue's
    snapshot: ask the queue again about those jobs before calling them unknown."""
    unknown = [v for v in report.violations if v.kind == "allocation_for_unknown_job"]
    if not unknown or "queue" not in config.database_urls:
        return
    try:
        known = await jobs_exist(config.database_urls["queue"], [v.subject for v in unknown])
    except Exception:
        return
    report.violations = [v for v in report.violations
                         if not (v.kind == "allocation_for_unknown_job" and v.subject in known)]


def _judge(config: CheckConfig, snap: Snapshot, report: Report, foreign: dict[str, str]) -> None:
    queue, placement, accounting, inventory = (snap.stores.get(s)
                                               for s in ("queue", "placement", "accounting", "inventory"))
    streams = snap.streams
    plan = {
        "gpu_exclusive": (lambda: invariants.gpu_exclusive(placement)) if placement else None,
        "job_state": (lambda: invariants.job_state(queue, streams)) if queue else None,
        "job_placement": (lambda: invariants.job_placement(queue, placement)) if queue and placement else None,
        "allocation_events": (lambda: invariants.allocation_events(placement, streams)) if placement else None,
        "quota_use": (lambda: invariants.quota_use(snap, placement, config.report_window_s)) if placement else None,
        "ledger": (lambda: invariants.ledger(accounting, placement)) if accounting and placement else None,
        "outbox": (lambda: invariants.outbox(snap.stores.values(), config.outbox_max_age_s)) if snap.stores else None,
        "event_delivery": (lambda: invariants.event_delivery(snap.stores.values(), streams, foreign))
        if streams and snap.stores else None,
        "consumer_lag": (lambda: invariants.consumer_lag(streams, config.lag_max_age_s)) if streams else None,
        "dead_letters": (lambda: invariants.dead_letters(snap.stores.values(), streams)) if streams else None,
        "event_origins": (lambda: invariants.event_origins(streams)) if streams else None,
        "job_liveness": (lambda: liveness.job_liveness(queue, placement, config.pending_max_age_s))
        if queue and placement else None,
        "scheduler_progress": (lambda: liveness.scheduler_progress(placement, config.decision_max_age_s))
        if placement else None,
        "telemetry_liveness": (lambda: liveness.telemetry_liveness(inventory, config.telemetry_max_age_s))
        if inventory else None,
    }
    for name in CHECKS:
        if not _wanted(config, name):
            report.skipped[name] = "not selected"
            continue
        run = plan.get(name)
        if run is None:
            report.skipped[name] = "its sources were not given or could not be read"
            continue
        checked, found = run()
        report.checked[name] = checked
        report.violations += found
    if placement is not None:
        report.info["quota_use"] = {f"{t}/{m}": round(v, 3) for (t, m), v in sorted(invariants.live_use(placement).items())}
    if streams is not None:
        report.info["dead_letters"] = invariants.dead_letter_summary(streams)
        report.info["dead_letter_sources"] = invariants.dead_letter_sources(streams)
        report.info["consumers"] = {f"{c.stream}/{c.name}": {"pending": c.num_pending, "ack_pending": c.num_ack_pending,
                                                           "redelivered": c.num_redelivered}
                                    for c in streams.consumers}
    report.info["outbox_unpublished"] = {s.service: sum(1 for r in s.outbox if not r.published)
                                         for s in snap.stores.values()}
    # retention horizons: events and inbox rows of facts before these may have been pruned (not looked for)
    report.info["pruned_before"] = {s.service: {"outbox": s.outbox_pruned_before, "inbox": s.inbox_pruned_before}
                                    for s in snap.stores.values()
                                    if s.outbox_pruned_before is not None or s.inbox_pruned_before is not None}
    report.info["read_at"] = datetime.now(UTC).isoformat()


async def _foreign_events(config: CheckConfig, snap: Snapshot) -> dict[str, str]:
    """Service-sourced events in the stream that no snapshot's outbox held: look again (they may be newer than the
    snapshot); those still missing were never in an outbox, unless emitted before the store's outbox horizon
    (retention pruned their rows: not looked for)."""
    assert snap.streams is not None
    known = {r.event_id for s in snap.stores.values() for r in s.outbox}
    candidates: dict[str, list[str]] = {}
    claimed: dict[str, str] = {}
    for e in snap.streams.events:
        service = (e.source or "").removeprefix("/gpupool/")
        if (e.event_id and e.event_id not in known and service in snap.stores
                and not invariants.maybe_pruned(snap.stores[service].outbox_pruned_before, e.time)):
            candidates.setdefault(service, []).append(e.event_id)
            claimed[e.event_id] = e.source or ""
    out: dict[str, str] = {}
    for service, ids in candidates.items():
        try:
            found = await outbox_has(config.database_urls[service], ids)
        except Exception:
            continue
        out.update({i: claimed[i] for i in ids if i not in found})
    return out


def _reported_use(config: CheckConfig) -> tuple[dict[tuple[str, str], float] | None, datetime | None, str | None]:
    """gpupool_quota_used_gpus from the placement replica that holds the lease (only the leader computes it)."""
    for url in config.placement_metrics:
        text = _get(url)
        if text is None or not re.search(r'^gpupool_leader\{[^}]*service="placement"[^}]*\} 1(\.0)?$', text, re.M):
            continue
        use: dict[tuple[str, str], float] = {}
        for m in re.finditer(r'^gpupool_quota_used_gpus\{([^}]*)\} (\S+)$', text, re.M):
            labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1)))
            use[(labels.get("team", ""), labels.get("gpu_model", ""))] = float(m.group(2))
        return use, datetime.now(UTC), url
    return None, None, None


def _get(url: str) -> str | None:
    try:
        with urllib.request.urlopen(url, timeout=3) as resp:
            return resp.read().decode()
    except Exception:
        return None
