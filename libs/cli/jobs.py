"""`gpupool jobs | describe | explain | scale | cancel | complete`: list jobs and act on one."""

from __future__ import annotations

import argparse
import os
import shlex
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from libs.cli.common import EXIT_OK, JOB_STATES, Adder, UsageError
from libs.cli.render import emit, fmt_age, fmt_duration, fmt_gib, key_values, raws, table
from libs.client import GpupoolClient
from libs.client.models import Allocation, Job


def job_shape(job: Job) -> str:
    """How a job holds GPUs, in words: "2 GPU(s)", "gang of 2 nodes × 8 GPUs", "3 replicas × 1 GPU(s)",
    "0.25 GPU + 12 GiB", "MIG 3g.40gb"."""
    share = _share(job)
    if share:
        return f"{job.replicas} replicas × {share}" if job.replicas > 1 else share
    if job.gang_nodes:
        return f"gang of {job.gang_nodes} nodes × {job.gpus_per_node} GPUs"
    if job.replicas > 1:
        return f"{job.replicas} replicas × {job.gpus} GPU(s)"
    return f"{job.gpus} GPU(s)"


def host_request(job: Job) -> str | None:
    """The host CPU and memory a job reserves on each node it holds: "4 CPU, 64.0 GiB per node"."""
    parts = ([f"{job.cpu_milli / 1000:g} CPU"] if job.cpu_milli else []) + \
        ([f"{fmt_gib(job.memory_mib)} GiB"] if job.memory_mib else [])
    return ", ".join(parts) + " per node" if parts else None


def _share(job: Job) -> str | None:
    if job.mig_profile:
        return f"MIG {job.mig_profile}"
    if job.gpu_fraction_milli:
        memory = f" + {job.gpu_memory_mib / 1024:g} GiB" if job.gpu_memory_mib else ""
        return f"{job.gpu_fraction_milli / 1000:g} GPU{memory}"
    return None


def _short_shape(job: Job) -> str | None:
    share = _share(job)
    if share:
        return share
    if job.gang_nodes:
        return f"gang {job.gang_nodes}×{job.gpus_per_node}"
    if job.replicas > 1:
        return f"{job.replicas} replicas"
    return None


def jobs_table(jobs: Sequence[Job]) -> str:
    if not jobs:
        return "No jobs."
    return table(["JOB ID", "NAME", "TEAM", "PROJECT", "KIND", "PRIORITY", "GPUS", "SHAPE", "MODELS", "STATE", "NODE",
                  "AGE"],
                 [[j.job_id, j.name, j.team, j.project, j.kind, j.priority_class, j.gpus, _short_shape(j),
                   j.gpu_models or "any", j.state, f"{j.cluster}/{j.node}" if j.node else None,
                   fmt_age(j.submitted_at)] for j in jobs])


def cmd_jobs(args: argparse.Namespace, gp: GpupoolClient) -> int:
    jobs = gp.list_jobs(team=args.team, state=args.state, limit=args.limit)
    emit(args, raws(jobs), lambda: jobs_table(jobs))
    return EXIT_OK


def allocations_table(allocs: Sequence[Allocation]) -> str:
    return table(["ALLOCATION", "NODE", "GPUS", "MODEL", "GRANTED", "RELEASED", "REASON"],
                 [[a.allocation_id, f"{a.cluster}/{a.node}", ",".join(str(g.index) for g in a.gpus),
                   ",".join(sorted({g.model for g in a.gpus})), a.granted_at, a.released_at, a.release_reason]
                  for a in allocs])


def trace_ref(trace_id: str | None) -> str | None:
    """The job's trace id, as a link when GPUPOOL_TRACE_URL_TEMPLATE (a URL with `{trace_id}`) says where traces
    are looked at (Grafana on Tempo, Jaeger)."""
    template = os.environ.get("GPUPOOL_TRACE_URL_TEMPLATE", "")
    if not trace_id or "{trace_id}" not in template:
        return trace_id
    return template.replace("{trace_id}", trace_id)


def describe_text(job: Job, allocs: Sequence[Allocation]) -> str:
    runtime = None
    if job.started_at:
        end = job.finished_at or datetime.now(UTC)
        runtime = fmt_age(job.started_at, now=end)
    out = [key_values([
        ("Job", job.job_id), ("Name", job.name), ("Team", job.team), ("Project", job.project),
        ("Kind", job.kind), ("Priority", job.priority_class),
        ("GPUs", f"{job.gpus} × {' or '.join(job.gpu_models) or 'any model'}"), ("Shape", job_shape(job)),
        ("State", job.state), ("Node", f"{job.cluster}/{job.node}" if job.node else None),
        ("Submitted", job.submitted_at), ("Started", job.started_at), ("Finished", job.finished_at),
        ("Runtime", runtime), ("Max runtime", fmt_duration(job.max_runtime_s)), ("Attempts", job.attempts),
        ("Message", job.message), ("Command", shlex.join(job.work.command) if job.work else None),
        ("Exit code", job.exit_code), ("Reason", job.reason), ("Host", host_request(job)),
        ("Selector", ",".join(f"{k}={v}" for k, v in sorted(job.node_selector.items())) or None),
        ("Preemptible", None if job.preemptible is None else "yes" if job.preemptible else "no"),
        ("Trace", trace_ref(job.raw.get("trace_id"))),
    ])]
    out.append("\nHistory:")
    if job.history:
        out.append(_indent(table(["AT", "FROM", "TO", "REASON"],
                                 [[h.at, h.from_state, h.to_state, h.reason] for h in job.history])))
    else:
        out.append("  (none)")
    out.append("\nAllocations:")
    out.append(_indent(allocations_table(allocs)) if allocs else "  (none)")
    return "\n".join(out)


def _indent(text: str) -> str:
    return "\n".join("  " + line for line in text.splitlines())


def cmd_describe(args: argparse.Namespace, gp: GpupoolClient) -> int:
    job = gp.get_job(args.job_id)
    allocs = gp.list_allocations(job_id=job.job_id)
    emit(args, {**job.raw, "allocations": raws(allocs)}, lambda: describe_text(job, allocs))
    return EXIT_OK


def explain_text(ex: Any) -> str:
    p = ex.placement
    pairs: list[tuple[str, Any]] = [("Job", ex.job_id), ("State", ex.state), ("Message", ex.message),
                                    ("Placement", p.state), ("Reason", p.reason), ("Detail", p.message)]
    if p.position is not None:
        basis = " (estimated until the next cycle)" if p.position_basis == "estimate" else ""
        pairs.append(("Position", f"{p.position} (1 = next among pending jobs){basis}"))
    if p.priority_class is not None:
        pairs.append(("Priority", f"{p.priority_class} ({p.priority})" if p.priority is not None
                      else p.priority_class))
    if p.replicas_wanted is not None or p.replicas_running:
        wanted = p.replicas_wanted if p.replicas_wanted is not None else "-"
        pairs.append(("Replicas", f"{p.replicas_running or 0} running of {wanted} wanted"))
    if p.allocations:
        pairs.append(("Allocations", p.allocations))
    if p.preempting_for_it:
        pairs.append(("Preempting", f"{', '.join(p.preempting_for_it)} (to make room for this job)"))
    if p.preemptor_job_id:
        pairs.append(("Preempted for", p.preemptor_job_id))
    if p.deadline:
        pairs.append(("GPUs back at", p.deadline))
    pairs += facts_pairs(p.facts or {})
    return key_values(pairs)


def _counts(d: dict[str, Any]) -> str:
    return ", ".join(f"{n} {k.replace('_', ' ')}" for k, n in d.items())


def facts_pairs(f: dict[str, Any]) -> list[tuple[str, Any]]:
    """A pending reason's facts (explain's `placement.facts`), one line per kind of fact."""
    out: list[tuple[str, Any]] = []
    if f.get("nodes_evaluated"):
        line = f"{f['nodes_evaluated']} evaluated"
        if f.get("filtered"):
            line += f"; filtered out: {_counts(f['filtered'])}"
        if f.get("short"):
            line += f"; no room: {_counts(f['short'])}"
        if f.get("exhausted"):
            line += f"; exhausted: {f['exhausted'].replace('_', ' ')}"
        out.append(("Nodes", line))
    q = f.get("quota")
    if q:
        model = "any model" if q.get("gpu_model") in ("*", "", None) else q["gpu_model"]
        out.append(("Quota", f"{q.get('path', '')} ({model}, {q.get('rule', '').replace('_', ' ')}): used "
                             f"{q.get('used_gpus', 0):g} + asked {q.get('asked_gpus', 0):g}, limit "
                             f"{q.get('limit_gpus', 0):g} (guaranteed {q.get('guaranteed_gpus', 0):g})"))
    if f.get("domain_kind"):
        where = f"{f['domain_kind']} {f['domain']}" if f.get("domain") else f"no {f['domain_kind']} yet"
        out.append(("Waits for", f"{where}: {f.get('domain_nodes', 0)} node(s) able, "
                                 f"{f.get('nodes_needed', 0)} needed"))
    if f.get("labels"):
        out.append(("Missing labels", ", ".join(f"{k}={v}" for k, v in f["labels"].items())))
    if f.get("holders"):
        out.append(("Reserved for", ", ".join(f["holders"])))
    if f.get("victims_considered") or f.get("victims"):
        line = f"{f.get('victims_considered', 0)} candidate(s) considered"
        if f.get("victims"):
            line += "; waiting for " + ", ".join(f"{v['job_id']} ({v['reason']})" for v in f["victims"])
            if f.get("victim_nodes"):
                line += f" on {', '.join(f['victim_nodes'])}"
        out.append(("Victims", line))
    w = f.get("wait")
    if w:
        out.append(("Not preempting", f"{', '.join(w.get('would_preempt', []))} would lose "
                                      f"{w.get('lost_gpu_hours', 0):.3g} GPU-hours; waiting has cost "
                                      f"{w.get('waited_gpu_hours', 0):.3g} (at most {w.get('max_wait_s', 0):g} s)"))
    if f.get("reservation_nodes"):
        nodes = ", ".join(f["reservation_nodes"])
        if f.get("soft_hold"):
            out.append(("Held nodes", f"{nodes} (soft hold: start unknown)"))
        else:
            rel = f.get("reservation_in_s")
            out.append(("Held nodes", f"{nodes} from {f.get('reservation_start')}"
                                      + (f" (in {rel:.0f} s)" if rel is not None and rel > 0 else "")))
    return out


def cmd_explain(args: argparse.Namespace, gp: GpupoolClient) -> int:
    ex = gp.explain_job(args.job_id)
    emit(args, ex.raw, lambda: explain_text(ex))
    return EXIT_OK


def cmd_scale(args: argparse.Namespace, gp: GpupoolClient) -> int:
    if args.replicas < 1:
        raise UsageError("--replicas must be at least 1")
    job = gp.scale_job(args.job_id, args.replicas)
    emit(args, job.raw, lambda: f"job {job.job_id} scaled to {job.replicas} replica(s) of {job.gpus} GPU(s) "
                                f"(state {job.state}); placement adds or releases allocations to match")
    return EXIT_OK


def cmd_cancel(args: argparse.Namespace, gp: GpupoolClient) -> int:
    job = gp.cancel_job(args.job_id, args.reason)
    emit(args, job.raw, lambda: f"job {job.job_id} is {job.state}")
    return EXIT_OK


def cmd_complete(args: argparse.Namespace, gp: GpupoolClient) -> int:
    job = gp.complete_job(args.job_id)
    emit(args, job.raw, lambda: f"job {job.job_id} is {job.state}")
    return EXIT_OK


def register(sub: argparse._SubParsersAction, add: Adder) -> None:
    """gpupool jobs | describe | explain | scale | cancel | complete."""
    p = add("jobs", cmd_jobs, "list jobs")
    p.add_argument("--team")
    p.add_argument("--state", choices=JOB_STATES)
    p.add_argument("--limit", type=int, help="show at most this many")

    p = add("describe", cmd_describe, "one job: its fields, state history and allocations")
    p.add_argument("job_id", metavar="JOB_ID")

    p = add("explain", cmd_explain, "why a job is pending, running or being preempted: reason, position, preemption")
    p.add_argument("job_id", metavar="JOB_ID")

    p = add("scale", cmd_scale, "change how many replicas a replicated job runs")
    p.add_argument("job_id", metavar="JOB_ID")
    p.add_argument("--replicas", type=int, required=True, metavar="N")

    p = add("cancel", cmd_cancel, "cancel a pending or running job")
    p.add_argument("job_id", metavar="JOB_ID")
    p.add_argument("--reason", help="why (recorded in the job's history)")

    p = add("complete", cmd_complete, "mark a running job completed (releases its GPUs)")
    p.add_argument("job_id", metavar="JOB_ID")
