"""Inventory rules, pure: what a sample says about a GPU's health and how the per-GPU health state machine moves,
when a node is lost and when it is back, one-minute rollups, orphans, and the pool view."""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

from libs.contracts import subjects
from libs.contracts.events import GpuRollup, GpuTelemetry
from libs.core import mig as migcat

READY = "ready"
LOST = "lost"

# --- the GPU health state machine ---------------------------------------------------------------------------------
#
#   healthy ──warn──▶ suspect ──warn × N (strike_gap_s apart)──▶ quarantined ◀──fatal── healthy | suspect
#      ▲                 │ clean for suspect_clear_s                  │ clean for recheck_after_s, or an operator
#      │◀────────────────┘                                            ▼ clears it
#      └──────────── clean for probation_s ─────────────────────── probation ──warn | fatal──▶ quarantined
#
# Only `healthy` GPUs get new work (placement reads the coarse `health`: suspect/probation are `degraded`,
# quarantined is `failed`). Quarantining a GPU that holds an allocation makes reclamation take it back.
HEALTHY, SUSPECT, QUARANTINED, PROBATION = "healthy", "suspect", "quarantined", "probation"
GPU_STATES = (HEALTHY, SUSPECT, QUARANTINED, PROBATION)
LEGACY_HEALTH = {HEALTHY: "healthy", SUSPECT: "degraded", PROBATION: "degraded", QUARANTINED: "failed"}
Level = Literal["clean", "warn", "fatal"]

# Xids after which a GPU must not run work until it is reset and rechecked (NVIDIA's Xid catalogue: double-bit /
# uncontained ECC, row-remap or page-retirement failure, fallen off the bus, GSP errors, ...). Every other Xid is
# a warning: one makes a GPU suspect, repeated ones quarantine it.
FATAL_XIDS = frozenset({48, 62, 64, 74, 79, 94, 95, 119, 120})
# Agent health reasons (services/agent/nvml_types.derive_health) that are fatal while they last, and those that are
# warnings. Thermal reasons are neither: throttling is an operating condition (visible in telemetry), not a fault.
_FATAL_REASONS = {"gpu_lost": "GpuLost", "ecc_dbe": "UncorrectableEcc", "row_remap_failed": "RemapFailure"}
_WARN_REASONS = {"retired_pages_pending": "RetiredPagesPending"}
# When a sample shows several causes, the reason named is the most specific (a GPU off the bus also reports Xid 79).
_REASON_ORDER = {r: i for i, r in enumerate(("GpuLost", "UncorrectableEcc", "RemapFailure", "FatalXid", "EccBurst",
                                              "EccStorm", "RetiredPagesPending", "NonFatalXid"))}


@dataclass(frozen=True, slots=True)
class HealthRules:
    fatal_xids: frozenset[int] = FATAL_XIDS
    sbe_burst: int = 10            # new correctable ECC errors between two samples that count as a burst
    suspect_strikes: int = 3       # warnings that quarantine a suspect GPU ("repeated suspect")
    strike_gap_s: float = 10.0     # warnings closer together than this are one strike (a sustained storm counts
                                   # once per gap, not once per sample, whatever the agent's interval)
    suspect_clear_s: float = 300.0  # a suspect GPU with no warning for this long is healthy again
    recheck_after_s: float | None = 900.0  # a quarantined GPU clean this long enters probation (None: operator only)
    probation_s: float = 600.0     # probation must stay clean this long to be healthy again


@dataclass(frozen=True, slots=True)
class Signal:
    level: Level
    reason: str = ""
    details: tuple[str, ...] = ()


CLEAN = Signal("clean")


def assess(sample: GpuTelemetry, prev_sbe: int | None, prev_dbe: int | None, rules: HealthRules) -> Signal:
    """What one sample says about its GPU, the worst first. Xids count from `xid_events` (new since the previous
    sample), not from the agent's latched reasons, so one Xid is one warning; fatal conditions the agent keeps
    reporting (a GPU off the bus, a latched fatal Xid, uncorrectable ECC) stay fatal for as long as they last."""
    if (not sample.xid_events and not sample.health_reasons and sample.ecc_volatile_dbe <= (prev_dbe or 0)
            and (prev_sbe is None or sample.ecc_volatile_sbe - prev_sbe < rules.sbe_burst)):
        return CLEAN  # nearly every sample: nothing below could fire
    fatal: list[tuple[str, str]] = []
    warn: list[tuple[str, str]] = []
    for xid in sorted(set(sample.xid_events)):
        (fatal if xid in rules.fatal_xids else warn).append(("FatalXid" if xid in rules.fatal_xids else "NonFatalXid",
                                                             f"xid{xid}"))
    if sample.ecc_volatile_dbe > (prev_dbe or 0):
        fatal.append(("UncorrectableEcc", f"ecc_dbe+{sample.ecc_volatile_dbe - (prev_dbe or 0)}"))
    new_sbe = sample.ecc_volatile_sbe - prev_sbe if prev_sbe is not None else 0
    if new_sbe >= rules.sbe_burst:
        warn.append(("EccBurst", f"ecc_sbe+{new_sbe}"))
    for reason in sample.health_reasons:
        key = reason.split(":", 1)[0]
        if key == "sbe_storm":
            # the agent's rate is smoothed over a minute, so one burst reads as a storm for a while: it counts only
            # while new errors keep arriving (a storm), not for the samples after a single burst
            if new_sbe > 0:
                warn.append(("EccStorm", reason))
        elif key in _FATAL_REASONS:
            fatal.append((_FATAL_REASONS[key], reason))
        elif key.startswith("xid") and key[3:].isdigit() and int(key[3:]) in rules.fatal_xids:
            fatal.append(("FatalXid", reason))
        elif key in _WARN_REASONS:
            warn.append((_WARN_REASONS[key], reason))
    for level, found in (("fatal", fatal), ("warn", warn)):
        if found:
            reason = min((r for r, _ in found), key=lambda r: _REASON_ORDER.get(r, len(_REASON_ORDER)))
            return Signal(level, reason, tuple(dict.fromkeys(d for _, d in found)))  # type: ignore[arg-type]
    return CLEAN


@dataclass(frozen=True, slots=True)
class GpuHealth:
    """One GPU's place in the state machine, as stored."""

    state: str = HEALTHY
    since: datetime | None = None          # when it entered `state`
    reason: str = ""
    last_signal_at: datetime | None = None  # the newest warning or fatal sample
    strikes: int = 0
    last_strike_at: datetime | None = None
    details: tuple[str, ...] = field(default=())


@dataclass(frozen=True, slots=True)
class HealthStep:
    health: GpuHealth
    changed: bool   # the state changed (an event is due)
    dirty: bool     # something to store (state or counters)


def _enter(h: GpuHealth, state: str, reason: str, at: datetime, details: tuple[str, ...] = ()) -> HealthStep:
    return HealthStep(replace(h, state=state, since=at, reason=reason, details=details,
                              strikes=0 if state != SUSPECT else h.strikes), True, True)


def _later(a: datetime | None, b: datetime) -> datetime:
    return b if a is None or b > a else a


def moves(state: str, signal: Signal) -> bool:
    """Whether `step` can change anything for a GPU in `state`: a clean sample leaves a healthy GPU as it is (the
    common case, which then needs no GpuHealth built at all)."""
    return state != HEALTHY or signal.level != "clean"


def step(h: GpuHealth, signal: Signal, at: datetime, rules: HealthRules) -> HealthStep:
    """Move one GPU through the state machine for one sample taken `at`."""
    if signal.level == "clean":
        quiet_since = h.last_signal_at or h.since
        quiet_s = (at - quiet_since).total_seconds() if quiet_since is not None else float("inf")
        if h.state == SUSPECT and quiet_s >= rules.suspect_clear_s:
            return _enter(h, HEALTHY, "SuspectCleared", at)
        if (h.state == QUARANTINED and rules.recheck_after_s is not None and quiet_s >= rules.recheck_after_s
                and h.reason != "QuarantinedByOperator"):  # what an operator took out, an operator puts back
            return _enter(h, PROBATION, "RecheckPassed", at)
        if h.state == PROBATION and h.since is not None and (at - h.since).total_seconds() >= rules.probation_s:
            return _enter(h, HEALTHY, "ProbationPassed", at)
        return HealthStep(h, False, False)
    seen = replace(h, last_signal_at=_later(h.last_signal_at, at))
    if h.state == QUARANTINED:
        return HealthStep(seen, False, seen != h)
    if h.state == PROBATION:
        return _enter(seen, QUARANTINED, "FailedProbation", at, (signal.reason, *signal.details))
    if signal.level == "fatal":
        return _enter(seen, QUARANTINED, signal.reason, at, signal.details)
    if h.state == HEALTHY:
        return _enter(replace(seen, strikes=1, last_strike_at=at), SUSPECT, signal.reason, at, signal.details)
    # suspect, another warning: a strike if it is not part of the last one
    if h.last_strike_at is not None and (at - h.last_strike_at).total_seconds() < rules.strike_gap_s:
        return HealthStep(seen, False, True)
    struck = replace(seen, strikes=h.strikes + 1, last_strike_at=at)
    if struck.strikes >= rules.suspect_strikes:
        return _enter(struck, QUARANTINED, "RepeatedSuspect", at, (signal.reason, *signal.details))
    return HealthStep(struck, False, True)


def operator_step(h: GpuHealth, action: str, at: datetime) -> HealthStep:
    """An operator's word: `clear` sends a quarantined GPU to probation (it must still prove itself) and a suspect
    or probation GPU straight to healthy; `quarantine` takes any GPU out of service now."""
    if action == "quarantine":
        return HealthStep(h, False, False) if h.state == QUARANTINED else \
            _enter(h, QUARANTINED, "QuarantinedByOperator", at)
    if h.state == QUARANTINED:
        return _enter(replace(h, last_signal_at=None), PROBATION, "ClearedByOperator", at)
    if h.state in (SUSPECT, PROBATION):
        return _enter(replace(h, last_signal_at=None), HEALTHY, "ClearedByOperator", at)
    return HealthStep(h, False, False)


LOST_PATIENCE = 4  # a fleet gone silent all at once is judged against its newest report for this many thresholds


def lost_cutoff(now: datetime, node_lost_after_s: float, newest_report: datetime | None = None,
                ready_nodes: int = 1) -> datetime:
    """A ready node whose last report is older than this is lost. When no ready node has reported within the
    threshold and there are several, the silence is more likely this service or the bus falling behind (or one
    agent process of a simulated fleet starved of CPU) than every node dying together: nodes are then judged
    against the newest report instead (one silent that much longer than the rest is still lost), for at most
    `LOST_PATIENCE` thresholds. (At 1,024 simulated nodes on 2 cores, start-up load declared the whole fleet lost
    three times in three minutes, and reclamation took back ~900 running jobs' GPUs.) A single node cannot be told
    from its own silence: it is judged by the clock alone."""
    plain = now - timedelta(seconds=node_lost_after_s)
    if newest_report is None or ready_nodes < 2 or newest_report >= plain:
        return plain
    return max(newest_report - timedelta(seconds=node_lost_after_s),
               now - timedelta(seconds=LOST_PATIENCE * node_lost_after_s))


def node_recovers(state: str, last_seen_before: datetime, sampled_at: datetime, now: datetime,
                  node_lost_after_s: float) -> bool:
    """A lost node is back when it reports something *new* (newer than what it last said before going silent) and
    *fresh* (not a backlog sample that would be lost again at the next sweep). A redelivered old sample is
    neither, so applying telemetry stays idempotent without an inbox."""
    return (state == LOST and sampled_at > last_seen_before
            and sampled_at >= lost_cutoff(now, node_lost_after_s))


# --- one-minute rollups -------------------------------------------------------------------------------------------
ROLLUP_WINDOW_S = 60  # store.apply_samples bins samples into these minutes (date_bin from a whole minute, UTC)
_EPOCH = datetime(2000, 1, 1, tzinfo=UTC)
_MINUTE = timedelta(seconds=ROLLUP_WINDOW_S)


def minute_of(at: datetime) -> int:
    """Which rollup minute a sample taken `at` belongs to (the same minutes as store.apply_samples)."""
    return (at - _EPOCH) // _MINUTE


def held_samples(previous_at: datetime | None, at: datetime, interval_s: float | None,
                 heartbeat_s: float | None) -> tuple[int, int]:
    """The samples an agent sampling by change left out between a GPU's previous sample and this one (taken `at`):
    each repeated the previous values (they moved less than the deadband), so the rollups count those values once
    per left-out interval, as if they had been sent. Returns (how many fall in the previous sample's minute, how
    many in this sample's minute); a left-out sample in a minute between them (a heartbeat over a minute) is not
    counted. A gap longer than the heartbeat is a silent agent, not an unchanged GPU: only a heartbeat's worth is
    counted. None/0 interval (an agent that sends every sample) or no previous sample: (0, 0)."""
    if previous_at is None or not interval_s:
        return 0, 0
    # plain seconds since 1970: its minutes are the rollups' minutes (2000-01-01 is a whole minute), and float
    # arithmetic is several times cheaper than datetime's for the thousands of samples a second this sees
    p, t = previous_at.timestamp(), at.timestamp()
    left_out = int((t - p) / interval_s + 0.5) - 1
    if heartbeat_s:
        left_out = min(left_out, int(heartbeat_s / interval_s + 0.5) - 1)
    if left_out <= 0:
        return 0, 0
    old_minute, new_minute = p // ROLLUP_WINDOW_S, t // ROLLUP_WINDOW_S
    if old_minute == new_minute:
        return 0, left_out

    def before(boundary: float) -> int:  # left-out samples (previous_at + k·interval, k ≥ 1) before `boundary`
        return min(left_out, max(0, math.ceil((boundary - p) / interval_s - 1e-6) - 1))

    return before((old_minute + 1) * ROLLUP_WINDOW_S), left_out - before(new_minute * ROLLUP_WINDOW_S)


def gpu_rollup(row: Mapping[str, Any]) -> GpuRollup:
    n = max(1, row["samples"])
    return GpuRollup(
        uuid=row["uuid"], index=row["idx"], samples=row["samples"],
        utilization_avg_pct=min(100.0, round(row["util_sum"] / n, 3)),
        utilization_max_pct=min(100.0, row["util_max"]), memory_used_avg_mib=round(row["mem_sum"] / n, 3),
        memory_used_max_mib=row["mem_max"],
        power_avg_w=round(row["power_sum"] / row["power_n"], 3) if row["power_n"] else None,
        temperature_max_c=row["temp_max"], process_count_max=row["procs_max"])


# --- orphans ------------------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class OrphanRules:
    process_after_s: float = 60.0     # a process on a GPU no allocation holds, for this long, is an orphan
    no_process_after_s: float = 1800.0  # an allocation whose GPUs showed no process for this long is one too


def process_without_allocation(procs_since: datetime | None, held: bool, now: datetime, rules: OrphanRules) -> bool:
    """Due when a GPU nobody holds has run processes continuously for `process_after_s` (a grant that is still on
    its way to inventory is covered by that delay)."""
    return not held and procs_since is not None and (now - procs_since).total_seconds() >= rules.process_after_s


def allocation_without_process(granted_at: datetime, last_process_at: datetime | None, now: datetime,
                               rules: OrphanRules) -> datetime | None:
    """Since when an allocation's GPUs have shown no process, if that is long enough to report; else None."""
    since = granted_at if last_process_at is None or last_process_at < granted_at else last_process_at
    return since if (now - since).total_seconds() >= rules.no_process_after_s else None


# --- the pool view ------------------------------------------------------------------------------------------------
IN_USE_UTIL_PCT = 5.0  # a GPU is "in use" when its latest fresh sample shows more utilisation than this
COUNTS = ("total", "healthy", "unhealthy", "on_lost_nodes", "in_use", "cordoned", "suspect", "quarantined",
          "probation")


def pool_view(models: Iterable[Mapping[str, Any]], nodes: Iterable[Mapping[str, Any]], *,
              fresh_within_s: float) -> dict[str, Any]:
    """Inventory's answer to the pool query: per cluster, per GPU model counts (with the uuids in use and
    unhealthy, for callers that know allocations), per node CPU/memory facts; and the sums over clusters."""
    clusters: dict[str, dict[str, Any]] = {}

    def cluster_entry(name: str) -> dict[str, Any]:
        return clusters.setdefault(name, {"cluster": name, "models": [], "nodes": []})

    overall: dict[str, dict[str, int]] = {}
    for m in models:
        in_use, unhealthy = list(m["in_use_gpus"]), list(m["unhealthy_gpus"])
        row = {"model": m["model"], "total": m["total"], "healthy": m["healthy"], "unhealthy": len(unhealthy),
               "on_lost_nodes": m["on_lost_nodes"], "in_use": len(in_use), "cordoned": m["cordoned"],
               "suspect": m["suspect"], "quarantined": m["quarantined"], "probation": m["probation"],
               "in_use_gpus": in_use, "unhealthy_gpus": unhealthy}
        cluster_entry(m["cluster"])["models"].append(row)
        total = overall.setdefault(m["model"], {"model": m["model"], **dict.fromkeys(COUNTS, 0)})
        for key in COUNTS:
            total[key] += row[key]
    for n in nodes:
        cluster_entry(n["cluster"])["nodes"].append({
            "node": n["node"], "hostname": n["hostname"], "state": n["state"], "cordoned": n["cordoned"],
            "gpu_states": {k: n[k] for k in GPU_STATES if n[k]},
            "sharing": {k: n[k] for k in ("exclusive", "fractional", "mig", "draining") if n[k]},
            "last_seen_at": n["last_seen_at"].isoformat(), "gpus": n["gpus"], "cpu_count": n["cpu_count"],
            "cpu_util_pct": n["cpu_util_pct"], "memory_mib": n["memory_mib"],
            "memory_used_mib": n["memory_used_mib"], "network": node_network(n), "storage": node_storage(n)})
    out = []
    for name in sorted(clusters):
        entry = clusters[name]
        entry["totals"] = {key: sum(r[key] for r in entry["models"]) for key in COUNTS}
        entry["node_totals"] = node_totals(entry["nodes"])
        out.append(entry)
    all_models = [overall[k] for k in sorted(overall)]
    return {
        "clusters": out,
        "all": {"models": all_models, "totals": {key: sum(r[key] for r in all_models) for key in COUNTS},
                "node_totals": sum_node_totals(e["node_totals"] for e in out)},
        "in_use_util_pct": IN_USE_UTIL_PCT,
        "fresh_within_s": fresh_within_s,
    }


# --- a node's host facts ------------------------------------------------------------------------------------------
NODE_TOTALS = ("nodes", "cpu_count", "memory_mib", "network_link_gbps", "storage_total_gib")


def _facts(raw: Any) -> list[dict[str, Any]]:
    """A JSONB list as asyncpg hands it over (text unless a codec is set)."""
    return json.loads(raw) if isinstance(raw, str) else list(raw or [])


def node_network(n: Mapping[str, Any]) -> dict[str, Any]:
    """The registered NICs, their summed link speed (Gbit/s; unknown speeds count 0) and the latest throughput."""
    nics = _facts(n["network"])
    return {"interfaces": nics,
            "link_gbps": round(sum(nic.get("speed_mbps") or 0 for nic in nics) / 1000, 3),
            "rx_mbps": n["network_rx_mbps"], "tx_mbps": n["network_tx_mbps"]}


def node_storage(n: Mapping[str, Any]) -> dict[str, Any]:
    """The registered volumes, their summed size and the latest space used over all of them (GiB)."""
    volumes = _facts(n["storage"])
    return {"volumes": volumes, "total_gib": round(sum(v["total_gib"] for v in volumes), 3),
            "used_gib": n["storage_used_gib"]}


def node_totals(nodes: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """What a set of pool node entries adds up to: nodes, CPUs, memory, link speed and storage."""
    rows = list(nodes)
    return {"nodes": len(rows), "cpu_count": sum(r["cpu_count"] for r in rows),
            "memory_mib": sum(r["memory_mib"] for r in rows),
            "network_link_gbps": round(sum(r["network"]["link_gbps"] for r in rows), 3),
            "storage_total_gib": round(sum(r["storage"]["total_gib"] for r in rows), 3)}


def sum_node_totals(totals: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = dict.fromkeys(NODE_TOTALS, 0)
    for t in totals:
        for key in NODE_TOTALS:
            out[key] += t[key]
    for key in ("network_link_gbps", "storage_total_gib"):
        out[key] = round(out[key], 3)
    return out


def registration_subject_error(subject: str, cmd: Any) -> str | None:
    """A node registers itself: on `...register_node.<cluster>.<node>`, which only that node's NATS identity may
    publish, naming that same node. Anything else (a node registering another, or a phantom) is refused."""
    expected = subjects.register_node(cmd.cluster, cmd.node)
    if subject != expected:
        return f"a registration of {cmd.cluster}/{cmd.node} must arrive on {expected}, not {subject}"
    return None


# --- sharing-mode changes ---------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class SharingChange:
    """What an operator's sharing-mode change does to one GPU: `refused` (with a problem code and message),
    `unchanged`, `apply` (the GPU is empty: the new mode now) or `drain` (it holds work: no new work on it, the new
    mode once the last allocation is released)."""

    outcome: str  # refused | unchanged | apply | drain
    code: str = ""
    message: str = ""


def sharing_change(model: str, current: str, target: str | None, mode: str, held: bool) -> SharingChange:
    """Decide an operator's change of a GPU's sharing mode. `target`: a change already waiting for the GPU to
    empty (a new request replaces it; asking for the current mode cancels it). MIG needs a model with MIG profiles
    (the node's agent turns the GPU's MIG mode on once it is empty); any other GPU can be exclusive or fractional
    (fractions are enforced with CUDA MPS)."""
    if mode == "mig" and not migcat.profiles_for(model):
        supported = ", ".join(sorted(migcat.CATALOGUE))
        return SharingChange("refused", "SharingModeUnsupported",
                             f"{model} has no MIG profiles: it can be exclusive or fractional (MIG: {supported})")
    if mode == current:
        return SharingChange("apply" if target else "unchanged")  # a waiting change is called off
    return SharingChange("drain" if held else "apply")
