"""A pending reason's message, rendered from its facts (`plan.ReasonFacts`) by one function, `render`: every
number a message says is a fact a caller can read as data too (explain's `facts`). Pure: times are rendered from
the facts alone (ISO-8601 UTC and seconds from the cycle's time), no clock is read.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime

from libs.core.model import WHOLE
from libs.core.plan import PendingReason, QuotaFacts, ReasonFacts, WaitFacts

# the census' words, in the order a message lists them
FILTER_WORDS = (
    ("cordoned", "not schedulable"),
    ("node_selector", "without its selector's labels"),
    ("gpu_model", "without a GPU of its models"),
    ("health", "with only unhealthy GPUs of its models"),
    ("sharing", "without a GPU in the sharing mode it needs"),
    ("host_size", "too small for its CPU/memory"),
)
SHORT_WORDS = (
    ("gpus", "short of free GPUs"),
    ("gpu_share", "short of GPU share"),
    ("mig_slice", "short of a free MIG slice"),
    ("cpu", "short of CPU"),
    ("memory", "short of memory"),
    ("reserved", "held for another job"),
    ("able", "able to take a member"),
)
DIMENSIONS = ("gpus", "gpu_share", "mig_slice", "cpu", "memory")  # what `exhausted` may name, ties in this order


def pending(job_id: str, code: str, facts: ReasonFacts) -> PendingReason:
    """The pending reason with its message rendered from `facts`."""
    return PendingReason(job_id, code, render(job_id, facts), facts)


def render(job_id: str, f: ReasonFacts) -> str:
    """The message of a pending reason: its main sentence, why it waits instead of preempting, and the nodes held
    for it; a job waiting for victims says whom (and, making room within its quota, the refusal)."""
    if f.victims:
        whys = sorted({why for _, why in f.victims})
        what = f"job(s) preempted to make room within its quota ({', '.join(whys)})" if f.within_quota \
            else "preempted job(s)"
        out = f"waiting for {len(f.victims)} {what} to leave {', '.join(f.victim_nodes)}"
        return out + (f"; {_main(job_id, f)}{_wait(f.wait)}" if f.within_quota else "")
    return _main(job_id, f) + _wait(f.wait) + _reservation(f)


def _main(job_id: str, f: ReasonFacts) -> str:
    c = f.cause
    if c == "quota":
        return quota_text(job_id, f.quota) if f.quota is not None else "over quota"
    if c == "no_room":
        host = f" with {f.cpu_milli} mCPU / {f.memory_mib} MiB" if f.cpu_milli or f.memory_mib else ""
        return f"no schedulable node has room for {f.ask}{host}" + census_text(f)
    if c == "gang":
        return (f"{f.ask}: all or nothing, and only {f.nodes_able} node(s) can take a member now "
                f"(need {f.nodes_needed})" + _domain(f) + census_text(f))
    if c.startswith("never_"):
        return _never(f) + "; it waits until the pool grows" + census_text(f)
    if c == "selector":
        wanted = ", ".join(f"{k}={v}" for k, v in f.labels)
        return f"no schedulable node has the label(s) its node_selector asks for: {wanted}"
    if c == "reserved":
        return (f"capacity that fits is reserved for {', '.join(f.holders)}; set max_runtime_s short enough to "
                f"backfill")
    if c == "fifo":
        return f"FIFO: waiting behind {f.blocked_by}, which does not fit yet"
    if c == "no_model":
        return f"no GPU model in the cluster can serve {f.ask}"
    return f.detail


def _never(f: ReasonFacts) -> str:
    c = f.cause
    if c == "never_host":
        return f"no node of this pool has {f.cpu_milli} mCPU / {f.memory_mib} MiB"
    if c == "never_node":
        return f"no node of this pool could hold {f.ask}, even empty"
    if c == "never_members":
        return (f"{f.ask}: only {f.nodes_able} node(s) of this pool could take a member, even empty "
                f"(need {f.nodes_needed})")
    return f"{f.ask}: this pool has {f.gpus_able} GPU(s) that could serve it, even empty"


def _domain(f: ReasonFacts) -> str:
    if not f.domain_kind:
        return ""
    if not f.domain:
        return (f"; waiting for {f.nodes_needed} node(s) in one {f.domain_kind}: no {f.domain_kind} has a node "
                f"that can take a member now")
    return f"; waiting for {f.nodes_needed} node(s) in one {f.domain_kind}: {f.domain_kind} {f.domain} has " \
           f"{f.domain_nodes}"


def census_text(f: ReasonFacts) -> str:
    """'; of 12 node(s): 2 not schedulable, 4 without a GPU of its models, 6 short of free GPUs' ('' without a
    census)."""
    if not f.nodes_evaluated:
        return ""
    filtered, short = dict(f.filtered), dict(f.short)
    parts = [f"{filtered[k]} {w}" for k, w in FILTER_WORDS if filtered.get(k)]
    parts += [f"{short[k]} {w}" for k, w in SHORT_WORDS if short.get(k)]
    return f"; of {f.nodes_evaluated} node(s): {', '.join(parts)}" if parts else ""


def _wait(w: WaitFacts | None) -> str:
    if w is None:
        return ""
    names = list(w.would_preempt)
    which = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
    return (f"; it would preempt {which}, but that would throw away {w.lost_gpu_s / 3600:.3g} GPU-hours of work; "
            f"waiting has cost {w.waited_gpu_s / 3600:.3g} so far, so it waits (at most {w.max_wait_s:g} s)")


def _reservation(f: ReasonFacts) -> str:
    if not f.reservation_nodes or f.reservation_start is None:
        return ""
    n = len(f.reservation_nodes)
    if math.isinf(f.reservation_start):
        return (f"; other work is steered away from {n} node(s) until running work there ends (a soft hold: that "
                f"end is unknown, so it idles nothing)")
    when = iso_utc(f.reservation_start)
    rel = f.reservation_in_s or 0.0
    return f"; reserved {n} node(s) to start by {when} ({f'in {rel:.0f} s' if rel >= 0.5 else 'now'})"


def iso_utc(t: float) -> str:
    """A time of the core (seconds since the epoch) as ISO-8601 UTC: '2026-12-02T09:45:37Z'."""
    try:
        return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    except (OverflowError, OSError, ValueError):
        return f"{t:.0f} s after the epoch"


def gpus(milli: float, model: str, unit: bool = True) -> str:
    """`milli` GPUs as a message says them: "2 H100-80GB GPU(s)", or "2 GPU(s) of any model" for a wildcard
    entry ("*" is never printed as a model)."""
    n = f"{milli / WHOLE:g}"
    if not unit:
        return n
    return f"{n} GPU(s) of any model" if model in ("*", "") else f"{n} {model} GPU(s)"


def quota_text(job_id: str, q: QuotaFacts) -> str:
    """The refusal of a quota entry, in words."""
    used, asked, g, limit = q.used_milli, q.asked_milli, q.guaranteed_milli, q.limit_milli
    if q.rule == "borrowing_limit":
        return (f"{q.path} would use {gpus(used + asked, q.gpu_model)} ({gpus(used, q.gpu_model, unit=False)} in "
                f"use), over its guarantee {g / WHOLE:g} + borrowing limit {(limit - g) / WHOLE:g}")
    if q.rule == "lending":
        return (f"{q.path} would borrow {gpus(used + asked - g, q.gpu_model)} but only "
                f"{max(limit - g, 0) / WHOLE:g} can be lent now")
    if q.rule == "guarantee_only":
        return (f"{job_id} is not preemptible, so it may use only {q.path}'s guarantee "
                f"({gpus(g, q.gpu_model)}, {used / WHOLE:g} in use); submit it with preemptible: true to borrow")
    if q.rule == "no_quota":
        return f"{q.path} has no quota for {q.gpu_model}"
    return "over quota"
