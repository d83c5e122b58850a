"""The people-facing `gpupool` commands, built on the Python client (libs.client).

  gpupool submit      submit a job from flags or a YAML file (-f job.yaml): one node, a gang, or replicas;
                      with -- CMD ARGS the node's agent runs it     (libs/cli/work.py: submit, run, logs)
  gpupool run         run a command on pool GPUs: submit, stream its output, exit with its exit code
  gpupool logs        a job's output (stdout, stderr; -f follows it)
  gpupool jobs        list jobs            gpupool describe JOB_ID   one job, its history and allocations
  gpupool explain     why a job waits      gpupool scale JOB_ID      change a replicated job's replicas
  gpupool cancel      cancel a job         gpupool complete JOB_ID   mark a running job finished
  gpupool nodes       nodes and GPUs       gpupool pool              per cluster/model: allocated, used, idle
  gpupool top         live per-GPU view    gpupool usage             the GPU-seconds ledger
  gpupool teams       list|create          gpupool quota             list|set|delete quota entries
  gpupool priority-classes  list|set       gpupool reclaim-policies  list|set per job kind
  gpupool approvals   list|approve|deny|rule (admission rules that hold big jobs for a person's approval)
  gpupool token       create|list|revoke   gpupool audit             the audit log (admins)
  gpupool node        one node's GPUs: health state, sharing, holder
  gpupool cordon|uncordon|drain NODE       stop / resume placing on a node; drain also takes its work back
  gpupool sharing NODE GPU MODE            exclusive | fractional | mig      gpupool gpu-health NODE GPU clear|quarantine
  gpupool orphans     processes on GPUs nobody holds; allocations that run no process
  gpupool whoami      the caller's identity, role and allowed actions
  gpupool report      usage|efficiency|capacity|waste (JSON, table or --csv; capacity: forecast and --what-if)
  gpupool history     export: the recorded jobs as a trace `gpupool sim replay` reads  (libs/cli/capacity.py)
  gpupool cost-rates  list|set|delete prices per GPU model and MIG profile
  gpupool completion  bash|zsh completion script

Every one takes --url / --token (else GPUPOOL_URL / GPUPOOL_TOKEN, else .gpupool/run.json) and -o table|json.
Exit status: 0 ok, 1 the API refused or failed, 2 usage or configuration error, 3 gateway unreachable.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from libs.client import ConfigError, GpupoolClient, GpupoolError
from libs.client.models import Allocation, ApiModel, Job, Node, NodeNetwork, NodeStorage, Pool, QuotaEntry

EXIT_OK, EXIT_API, EXIT_USAGE, EXIT_UNREACHABLE = 0, 1, 2, 3
JOB_STATES = ("awaiting_approval", "pending", "launching", "running", "preempting", "completed", "cancelled",
              "failed")
APPROVAL_STATES = ("pending", "approved", "denied")
APPROVAL_RULES = ("gpus_over", "runtime_over_s", "priority_class")
JOB_KINDS = ("training", "inference", "dev", "batch")
PRIORITY_CLASSES = ("production-inference", "high", "normal", "low", "best-effort")
ROLES = ("platform-admin", "operator", "team-admin", "member", "viewer", "service")
USED_UTIL_PCT = 5.0  # a GPU counts as "used" above this utilization
CLEAR = "\x1b[H\x1b[2J"


class UsageError(Exception):
    """Bad input from the user (exit 2)."""


# --- output ---------------------------------------------------------------------------------------------------------
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def cell(value: Any) -> str:
    """One table cell: None → "-", datetimes in UTC, floats short; control characters never reach the terminal."""
    if value is None or value == "":
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, datetime):
        return fmt_time(value)
    if isinstance(value, float):
        return f"{value:.1f}" if abs(value) < 1000 else f"{value:.0f}"
    if isinstance(value, list | tuple):
        return ",".join(cell(v) for v in value) or "-"
    return _CONTROL.sub(" ", str(value))


def _numeric(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """A plain aligned table: two spaces between columns, numeric columns right-aligned, no trailing blanks."""
    rows = [list(r) for r in rows]
    width = len(headers)
    for r in rows:
        if len(r) != width:
            raise ValueError(f"row has {len(r)} cells, table has {width} columns")
    right = [bool(rows) and all(_numeric(r[i]) or r[i] is None for r in rows)
             and any(_numeric(r[i]) for r in rows) for i in range(width)]
    text = [[cell(h) for h in headers]] + [[cell(v) for v in r] for r in rows]
    widths = [max(len(line[i]) for line in text) for i in range(width)]
    out = []
    for line in text:
        parts = [c.rjust(widths[i]) if right[i] else c.ljust(widths[i]) for i, c in enumerate(line)]
        out.append("  ".join(parts).rstrip())
    return "\n".join(out)


def key_values(pairs: Sequence[tuple[str, Any]]) -> str:
    pad = max(len(k) for k, _ in pairs) + 2
    return "\n".join(f"{(k + ':').ljust(pad)}{cell(v)}" for k, v in pairs)


def fmt_time(value: datetime | None) -> str:
    if value is None:
        return "-"
    if value.tzinfo is not None:
        value = value.astimezone(UTC)
    return value.strftime("%Y-%m-%d %H:%M:%S")


def fmt_age(value: datetime | None, now: datetime | None = None) -> str:
    if value is None:
        return "-"
    now = now or datetime.now(UTC)
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    seconds = max(0, int((now - value).total_seconds()))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def fmt_gib(mib: float | None) -> str:
    return "-" if mib is None else f"{mib / 1024:.1f}"


def num(value: float | None) -> int | float | None:
    """A GPU count or weight as people write it: 8, not 8.0; 0.5 stays 0.5."""
    if value is None or isinstance(value, bool):
        return value
    return int(value) if float(value).is_integer() else value


_DURATION = re.compile(r"(\d+(?:\.\d+)?)([smhd])")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(text: str | float | int) -> float:
    """Seconds from "3600", "90s", "30m", "2h", "1d" or "1h30m"."""
    if isinstance(text, int | float) and not isinstance(text, bool):
        return float(text)
    raw = str(text).strip().lower()
    try:
        return float(raw)
    except ValueError:
        pass
    parts = _DURATION.findall(raw)
    if not raw or not parts or "".join(n + u for n, u in parts) != raw:
        raise UsageError(f"{text!r} is not a duration (seconds, or e.g. 90s, 30m, 2h, 1d, 1h30m)")
    return sum(float(n) * _UNIT_S[u] for n, u in parts)


def fmt_duration(seconds: float | None) -> str | None:
    """3600 → "1h", 5400 → "1h30m", 90 → "1m30s"; None stays None."""
    if seconds is None:
        return None
    left, out = int(round(seconds)), []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if left >= size or (unit == "s" and not out):
            out.append(f"{left // size}{unit}")
            left %= size
    return "".join(out)


def emit(args: argparse.Namespace, raw: Any, render: Callable[[], str]) -> None:
    if args.output == "json":
        print(json.dumps(raw, indent=2, sort_keys=False, default=str))
    else:
        print(render())


def raws(items: Iterable[ApiModel]) -> list[dict[str, Any]]:
    return [i.raw for i in items]


# --- job spec: YAML file + flags -----------------------------------------------------------------------------------
SPEC_KEYS = {"name": "name", "team": "team", "project": "project", "gpus": "gpus", "kind": "kind",
             "priority_class": "priority_class", "priority-class": "priority_class",
             "gpu_models": "gpu_models", "gpu-models": "gpu_models", "models": "gpu_models", "model": "gpu_models",
             "idempotency_key": "idempotency_key", "idempotency-key": "idempotency_key",
             "gang_nodes": "gang_nodes", "gang-nodes": "gang_nodes",
             "gpus_per_node": "gpus_per_node", "gpus-per-node": "gpus_per_node", "replicas": "replicas",
             "max_runtime_s": "max_runtime_s", "max_runtime": "max_runtime_s", "max-runtime": "max_runtime_s",
             "gpu_fraction_milli": "gpu_fraction_milli", "fraction": "gpu_fraction_milli",
             "gpu_memory_mib": "gpu_memory_mib", "gpu-memory": "gpu_memory_mib", "mig_profile": "mig_profile",
             "mig": "mig_profile", "exclusive": "exclusive", "min_replicas": "min_replicas",
             "min-replicas": "min_replicas", "max_replicas": "max_replicas", "max-replicas": "max_replicas",
             "autoscale": "autoscale", "cpu": "cpu", "cpu_milli": "cpu_milli", "memory": "memory_mib",
             "memory_mib": "memory_mib", "node_selector": "node_selector", "node-selector": "node_selector",
             "selector": "node_selector", "preemptible": "preemptible"}
SPEC_FIELDS = ("name, team, project, gpus, gpu_models, kind, priority_class, gang_nodes, gpus_per_node, replicas, "
               "max_runtime_s, gpu_fraction_milli, gpu_memory_mib, mig_profile, exclusive, idempotency_key, "
               "min_replicas, max_replicas, autoscale, cpu (cores) or cpu_milli, memory_mib (or memory), "
               "node_selector, preemptible; the work: command, env, workdir, limits, stop_signal, "
               "stop_grace_s, warn_before_s, warn_signal, restart, isolation, image, rootfs, ports, health")


def load_spec_file(path: str) -> dict[str, Any]:
    import yaml

    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text()
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark is not None else ""
        raise UsageError(f"{path} is not valid YAML{where}") from None
    if doc is None:
        return {}
    if not isinstance(doc, dict):
        raise UsageError(f"{path} must be a YAML mapping of job fields (name, team, gpus, ...)")
    return doc


def merge_spec(file_doc: dict[str, Any] | None, flags: dict[str, Any]) -> dict[str, Any]:
    """The job to submit: the file's fields, then every flag that was given on top. Unknown keys, wrong types and
    missing required fields are usage errors."""
    spec: dict[str, Any] = {}
    for key, value in (file_doc or {}).items():
        target = SPEC_KEYS.get(str(key))
        if target is None:
            raise UsageError(f"unknown job field {key!r} (allowed: {SPEC_FIELDS})")
        spec[target] = value
    for key, value in flags.items():
        if value is not None and value != []:
            spec[key] = value
    if "gpu_models" in spec:
        models = spec["gpu_models"]
        if isinstance(models, str):
            models = [m.strip() for m in models.split(",") if m.strip()]
        if not isinstance(models, list) or not all(isinstance(m, str) for m in models):
            raise UsageError("gpu_models must be a model name or a list of model names")
        spec["gpu_models"] = models
    if "gpu_fraction_milli" in spec and isinstance(spec["gpu_fraction_milli"], float | str) \
            and not str(spec["gpu_fraction_milli"]).strip().isdigit():
        spec["gpu_fraction_milli"] = parse_fraction(spec["gpu_fraction_milli"])
    if "gpu_memory_mib" in spec:
        spec["gpu_memory_mib"] = parse_mib(spec["gpu_memory_mib"])
    if (spec.get("gpu_fraction_milli") or spec.get("mig_profile")) and "gpus" not in spec:
        spec["gpus"] = 1  # a share is of one GPU
    if "exclusive" in spec and not isinstance(spec["exclusive"], bool):
        raise UsageError("exclusive must be true or false")
    host_fields(spec)
    for key in ("gpus", "gang_nodes", "gpus_per_node", "replicas", "gpu_fraction_milli"):
        if key in spec:
            spec[key] = _whole(key, spec[key])
    if "max_runtime_s" in spec:
        spec["max_runtime_s"] = parse_duration(spec["max_runtime_s"])
        if spec["max_runtime_s"] <= 0:
            raise UsageError("max runtime must be positive")
    for key in ("name", "team", "project", "kind", "priority_class", "idempotency_key"):
        if key in spec and not isinstance(spec[key], str):
            spec[key] = str(spec[key])
    if spec.get("gang_nodes"):
        if not spec.get("gpus_per_node"):
            raise UsageError("a gang needs --gpus-per-node as well as --gang-nodes")
        if spec.get("replicas", 1) != 1:
            raise UsageError("a gang cannot also have replicas")
        product = spec["gang_nodes"] * spec["gpus_per_node"]
        if spec.setdefault("gpus", product) != product:  # --gpus may be left out of a gang: it is the product
            raise UsageError(f"a gang's gpus ({spec['gpus']}) must equal gang_nodes × gpus_per_node ({product})")
    elif spec.get("gpus_per_node"):
        raise UsageError("--gpus-per-node needs --gang-nodes")
    missing = [k for k in ("name", "team", "gpus") if k not in spec]
    if missing:
        raise UsageError("missing " + ", ".join(f"--{m}" for m in missing) + " (as flags or in the -f file)")
    return spec


def host_fields(spec: dict[str, Any]) -> None:
    """The job's host CPU (`cpu` in cores → cpu_milli), memory (MiB or with a unit), node selector (a mapping,
    or KEY=VALUE strings) and preemptible flag, in the body's terms (in place)."""
    if "cpu" in spec:
        spec["cpu_milli"] = parse_cpu(spec.pop("cpu"))
    if "cpu_milli" in spec:
        spec["cpu_milli"] = _whole("cpu_milli", spec["cpu_milli"])
    if "memory_mib" in spec:
        spec["memory_mib"] = parse_mib(spec["memory_mib"])
    if "node_selector" in spec:
        spec["node_selector"] = parse_selector(spec["node_selector"])
    if "preemptible" in spec and not isinstance(spec["preemptible"], bool):
        raise UsageError("preemptible must be true or false")


def parse_cpu(value: Any) -> int:
    """Host CPU in cores ('4', '0.5', '500m' as Kubernetes writes milli-cores) → milli-cores."""
    text = str(value).strip().lower()
    try:
        milli = int(text[:-1]) if text.endswith("m") else round(float(text) * 1000)
    except ValueError:
        raise UsageError(f"cpu must be cores like 4 or 0.5 (or milli-cores like 500m), not {value!r}") from None
    if milli <= 0:
        raise UsageError(f"cpu must be more than 0, not {value!r}")
    return milli


def parse_selector(value: Any) -> dict[str, str]:
    """A node selector: a mapping (YAML), or KEY=VALUE strings (repeated --selector flags)."""
    if isinstance(value, dict):
        return {str(k): "" if v is None else str(v).lower() if isinstance(v, bool) else str(v)
                for k, v in value.items()}
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list):
        raise UsageError("node_selector must be a mapping of label: value")
    out: dict[str, str] = {}
    for item in items:
        key, eq, val = str(item).partition("=")
        if not eq or not key.strip():
            raise UsageError(f"--selector expects KEY=VALUE, not {item!r}")
        out[key.strip()] = val.strip()
    return out


def parse_fraction(value: Any) -> int:
    """A share of one GPU: '0.25', '25%' or milli-GPU ('250') → 250."""
    text = str(value).strip()
    try:
        if text.endswith("%"):
            milli = round(float(text[:-1]) * 10)
        elif "." in text:
            milli = round(float(text) * 1000)
        else:
            milli = int(text)
    except ValueError:
        raise UsageError(f"fraction must be like 0.25, 25% or 250 (milli-GPU), not {value!r}") from None
    if not 0 < milli < 1000:
        raise UsageError(f"a fraction is more than 0 and less than one GPU, not {value!r}")
    return milli


def parse_mib(value: Any) -> int:
    """GPU memory: MiB as a number, or with a unit ('12GiB', '512MiB', '16G')."""
    text = str(value).strip()
    units = {"gib": 1024, "gb": 1024, "g": 1024, "mib": 1, "mb": 1, "m": 1}
    lowered = text.lower()
    for unit, factor in units.items():
        if lowered.endswith(unit) and lowered[: -len(unit)].strip().replace(".", "", 1).isdigit():
            return round(float(lowered[: -len(unit)]) * factor)
    if text.isdigit():
        return int(text)
    raise UsageError(f"GPU memory must be MiB or e.g. 12GiB, not {value!r}")


def _whole(key: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int | str) or not str(value).strip().isdigit():
        raise UsageError(f"{key} must be a whole number, not {value!r}")
    return int(value)


# --- client ---------------------------------------------------------------------------------------------------------
def make_client(args: argparse.Namespace) -> GpupoolClient:
    """Built from --url/--token, else the environment, else run.json. Tests replace this function."""
    return GpupoolClient.from_env(getattr(args, "url", None), getattr(args, "token", None))


# --- commands -------------------------------------------------------------------------------------------------------
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
        return f"{job.gpu_fraction_milli / 1000:g} GPU + {fmt_gib(job.gpu_memory_mib)}"
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


_NIC_KINDS = {"infiniband": "IB", "ethernet": "Eth"}


def fmt_speed(mbps: int | None) -> str:
    """400000 → "400G", 2500 → "2.5G", 100 → "100M", None → "?" (a link that is down or unknown)."""
    if mbps is None:
        return "?"
    if mbps < 1000:
        return f"{mbps}M"
    return f"{num(round(mbps / 1000, 1))}G"


def fmt_network(net: NodeNetwork) -> str | None:
    """A node's NICs grouped by kind and speed, fastest first: "8×400G IB, 2×100G Eth"; None without NICs."""
    groups: dict[tuple[int, str], int] = {}
    for nic in net.interfaces:
        key = (nic.speed_mbps if nic.speed_mbps is not None else -1, nic.kind)
        groups[key] = groups.get(key, 0) + 1
    parts = [f"{count}×{fmt_speed(None if speed < 0 else speed)} {_NIC_KINDS.get(kind, kind)}"
             for (speed, kind), count in sorted(groups.items(), key=lambda kv: (-kv[0][0], kv[0][1]))]
    return ", ".join(parts) or None


def fmt_tib(gib: float | None) -> str:
    if gib is None:
        return "-"
    tib = gib / 1024
    return f"{tib:.1f}" if tib >= 0.1 or tib == 0 else f"{tib:.2g}"


def fmt_storage(st: NodeStorage) -> str | None:
    """Used over total across a node's volumes, in TiB: "1.2/27.8 TiB" ("-/27.8 TiB" before any sample); None
    without volumes."""
    if not st.volumes:
        return None
    return f"{fmt_tib(st.used_gib)}/{fmt_tib(st.total_gib)} TiB"


def nodes_table(nodes: Sequence[Node]) -> str:
    if not nodes:
        return "No nodes."
    rows = []
    for n in nodes:
        healthy = sum(1 for g in n.gpus if g.health == "healthy")
        models = sorted({g.model for g in n.gpus})
        state = n.state + (" (drained)" if n.drained else " (cordoned)" if n.cordoned else "")
        rows.append([n.cluster, n.node, state, len(n.gpus), healthy, models,
                     n.cpu_util_pct, fmt_network(n.network), fmt_storage(n.storage),
                     fmt_age(n.last_seen_at) + " ago" if n.last_seen_at else None])
    return table(["CLUSTER", "NODE", "STATE", "GPUS", "HEALTHY", "MODELS", "CPU %", "NETWORK", "STORAGE",
                  "LAST SEEN"], rows)


def cmd_nodes(args: argparse.Namespace, gp: GpupoolClient) -> int:
    nodes = gp.list_nodes(cluster=args.cluster)
    emit(args, raws(nodes), lambda: nodes_table(nodes))
    return EXIT_OK


def pool_rows(pool: Pool) -> list[dict[str, Any]]:
    """One row per (cluster, GPU model) from GET /v1/pool, in the CLI's columns (`used` is the gateway's
    `in_use`: utilization above its threshold in fresh telemetry)."""
    rows = []
    for c in sorted(pool.clusters, key=lambda c: c.cluster):
        for m in sorted(c.models, key=lambda m: m.model or ""):
            rows.append({"cluster": c.cluster, "model": m.model, "total": m.total, "allocated": m.allocated,
                         "used": m.in_use, "allocated_idle": m.allocated_idle, "unhealthy": m.unhealthy,
                         "free": m.free})
    return rows


def pool_table(summary: Sequence[dict[str, Any]]) -> str:
    if not summary:
        return "No GPUs."
    cols = ("total", "allocated", "used", "allocated_idle", "unhealthy", "free")
    rows = [[r["cluster"], r["model"], *(r[c] for c in cols)] for r in summary]
    if len(summary) > 1:
        rows.append(["all", "", *(sum(r[c] for r in summary) for c in cols)])
    return table(["CLUSTER", "MODEL", "TOTAL", "ALLOCATED", "USED", "ALLOC-IDLE", "UNHEALTHY", "FREE"], rows)


def cmd_pool(args: argparse.Namespace, gp: GpupoolClient) -> int:
    if args.fragmentation:
        frag = gp.fragmentation(cluster=args.cluster)
        emit(args, frag.raw, lambda: fragmentation_text(frag))
        return EXIT_OK
    pool = gp.pool(cluster=args.cluster)
    emit(args, pool.raw, lambda: pool_table(pool_rows(pool)))
    return EXIT_OK


def fragmentation_text(frag: Any) -> str:
    rows = table(("CLUSTER", "MODEL", "GPUS", "FREE", "FRAGMENTED", "SHARE"),
                 [(r.cluster, r.gpu_model, r.gpus, f"{r.free_gpus:g}", f"{r.fragmented_gpus:.2f}",
                   f"{100 * r.fragmented_share:.0f}%") for r in frag.rows])
    def shape(w: Any) -> str:
        size = f"{w.gpu_milli / 1000:g} GPU" if w.gpu_milli < 1000 else f"{w.gpus} GPU{'s' * (w.gpus > 1)}"
        return f"{size}{' of ' + '/'.join(w.gpu_models) if w.gpu_models else ''} {100 * w.share:.0f}%"

    mix = ", ".join(shape(w) for w in frag.workload) or "none (nothing asked for recently)"
    return f"{rows}\nrecent workload: {mix}"


def top_rows(nodes: Sequence[Node], allocs: Sequence[Allocation], jobs: Sequence[Job]) -> list[dict[str, Any]]:
    holder = {g.uuid: a for a in allocs if a.active for g in a.gpus}
    names = {j.job_id: j for j in jobs}
    rows = []
    for n in nodes:
        for g in sorted(n.gpus, key=lambda g: g.index):
            t = g.telemetry
            a = holder.get(g.uuid)
            job = names.get(a.job_id) if a else None
            rows.append({
                "cluster": n.cluster, "node": n.node, "index": g.index, "model": g.model,
                "util_pct": t.utilization_gpu_pct if t else None,
                "memory_used_mib": t.memory_used_mib if t else None, "memory_total_mib": g.memory_mib,
                "temperature_c": t.temperature_c if t else None, "power_w": t.power_w if t else None,
                "health": g.health, "job_id": a.job_id if a else None, "team": a.team if a else None,
                "job_name": job.name if job else None,
            })
    return rows


def top_frame(rows: Sequence[dict[str, Any]], where: str, now: datetime | None = None) -> str:
    now = now or datetime.now(UTC)
    alloc = sum(1 for r in rows if r["job_id"])
    used = sum(1 for r in rows if (r["util_pct"] or 0) > USED_UTIL_PCT)
    idle = sum(1 for r in rows if r["job_id"] and (r["util_pct"] or 0) <= USED_UTIL_PCT)
    head = (f"gpupool top · {where} · {now.strftime('%H:%M:%S')} UTC · {len(rows)} GPUs · {alloc} allocated · "
            f"{used} used (>{USED_UTIL_PCT:g}% util) · {idle} allocated-idle")
    if not rows:
        return head + "\n\nNo GPUs."

    def mem(r: dict[str, Any]) -> str:
        return f"{fmt_gib(r['memory_used_mib'])}/{fmt_gib(r['memory_total_mib'])}"

    def util(r: dict[str, Any]) -> Any:
        return None if r["util_pct"] is None else round(float(r["util_pct"]))

    def holder(r: dict[str, Any]) -> Any:
        if not r["job_id"]:
            return None
        return f"{r['job_id']} ({r['team']}/{r['job_name']})" if r["job_name"] else f"{r['job_id']} ({r['team']})"

    body = table(["NODE", "GPU", "MODEL", "UTIL %", "MEM GiB", "TEMP C", "POWER W", "HEALTH", "ALLOCATED TO"],
                 [[f"{r['cluster']}/{r['node']}", r["index"], r["model"], util(r), mem(r),
                   None if r["temperature_c"] is None else round(float(r["temperature_c"])),
                   None if r["power_w"] is None else round(float(r["power_w"])), r["health"], holder(r)]
                  for r in rows])
    return f"{head}\n\n{body}"


def cmd_top(args: argparse.Namespace, gp: GpupoolClient) -> int:
    if args.interval <= 0:
        raise UsageError("--interval must be a positive number of seconds")

    def sample() -> list[dict[str, Any]]:
        return top_rows(gp.list_nodes(cluster=args.cluster), gp.list_allocations(active=True),
                        gp.list_jobs(state="running"))

    rows: list[dict[str, Any]] = sample()  # a first failure (bad token, unreachable) ends the command
    error: GpupoolError | None = None
    try:
        while True:
            if args.output == "json":
                print(json.dumps({"error": str(error)} if error else rows, default=str), flush=True)
            elif error:  # keep watching through a restart of the gateway; say so on screen
                print(f"{CLEAR}gpupool top · {gp.base_url} · error: {error} · retrying every {args.interval:g}s",
                      flush=True)
            else:
                frame = top_frame(rows, gp.base_url)
                print(frame if args.once else f"{CLEAR}{frame}\n\n(Ctrl-C to quit)", flush=True)
            if args.once:
                return EXIT_OK
            time.sleep(args.interval)
            try:
                rows, error = sample(), None
            except GpupoolError as exc:
                error = exc
    except KeyboardInterrupt:  # the way out of the live view
        return EXIT_OK


def cmd_teams(args: argparse.Namespace, gp: GpupoolClient) -> int:
    teams = gp.list_teams()

    def render() -> str:
        if not teams:
            return "No teams."
        return table(["TEAM", "ORG", "QUOTAS (model guaranteed/borrowing limit)"],
                     [[t.team, t.org, "; ".join(f"{q.gpu_model} {cell(num(q.guaranteed))}/"
                                                f"{cell(num(q.borrowing_limit)) if q.borrowing_limit is not None else 'unlimited'}"
                                                for q in t.quotas) or None] for t in teams])

    emit(args, raws(teams), render)
    return EXIT_OK


def cmd_teams_create(args: argparse.Namespace, gp: GpupoolClient) -> int:
    team = gp.create_team(args.name, org=args.org)
    emit(args, team.raw, lambda: f"team {team.team} (org {team.org}); give it a quota: "
                                 f"gpupool quota set {team.org}/{team.team} --model MODEL --guaranteed N")
    return EXIT_OK


# --- quotas, priority classes, approvals, reclaim policies ------------------------------------------------------------
def parse_limit(text: str) -> float | None:
    """A GPU count, or "unlimited"/"none" (borrowing) / "all" (lending): no limit."""
    if text.strip().lower() in ("unlimited", "none", "all", "null", "-"):
        return None
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of GPUs (or 'unlimited')") from None
    if value < 0:
        raise argparse.ArgumentTypeError("must not be negative")
    return value


def _limit(value: float | None, none: str) -> Any:
    return none if value is None else num(value)


def quotas_table(entries: Sequence[QuotaEntry]) -> str:
    if not entries:
        return "No quota entries."
    return table(["PATH", "MODEL", "GUARANTEED", "BORROWING LIMIT", "LENDING LIMIT", "WEIGHT", "UPDATED"],
                 [[q.path, q.gpu_model, num(q.guaranteed), _limit(q.borrowing_limit, "unlimited"),
                   _limit(q.lending_limit, "all unused"), num(q.weight), q.updated_at] for q in entries])


def cmd_quota_list(args: argparse.Namespace, gp: GpupoolClient) -> int:
    entries = gp.list_quotas()
    emit(args, raws(entries), lambda: quotas_table(entries))
    return EXIT_OK


_UNSET: Any = object()  # a flag that was not given (None means "no limit" for the limits)


def cmd_quota_set(args: argparse.Namespace, gp: GpupoolClient) -> int:
    """Changes only the fields given; the others keep the entry's current values (or the defaults for a new one)."""
    current = next((q for q in gp.list_quotas() if q.path == args.path and q.gpu_model == args.model), None)
    fields = {"guaranteed": current.guaranteed if current else 0.0,
              "borrowing_limit": current.borrowing_limit if current else None,
              "lending_limit": current.lending_limit if current else None,
              "weight": current.weight if current else 1.0}
    for key in fields:
        value = getattr(args, key)
        if value is not _UNSET:
            fields[key] = value
    if fields["guaranteed"] < 0 or fields["weight"] <= 0:
        raise UsageError("--guaranteed must not be negative and --weight must be positive")
    entry = gp.set_quota(args.path, args.model, **fields)
    emit(args, entry.raw, lambda: (
        f"quota {entry.path} {entry.gpu_model}: guaranteed {cell(num(entry.guaranteed))} · borrowing limit "
        f"{cell(_limit(entry.borrowing_limit, 'unlimited'))} · lending limit "
        f"{cell(_limit(entry.lending_limit, 'all unused'))} · weight {cell(num(entry.weight))}"))
    return EXIT_OK


def cmd_quota_delete(args: argparse.Namespace, gp: GpupoolClient) -> int:
    gp.delete_quota(args.path, args.model)
    emit(args, {"path": args.path, "gpu_model": args.model, "deleted": True},
         lambda: f"quota {args.path} {args.model} deleted")
    return EXIT_OK


def parse_until(text: str, now: datetime | None = None) -> datetime:
    """An end date: ISO 8601 ('2026-12-24', '2026-12-24T18:00Z') or a duration from now ('7d', '12h')."""
    now = now or datetime.now(UTC)
    try:
        return now + timedelta(seconds=parse_duration(text))
    except UsageError:
        pass
    try:
        when = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise UsageError(f"--until must be a date (2026-12-24) or a duration (7d), not {text!r}") from None
    return when if when.tzinfo else when.replace(tzinfo=UTC)


def cmd_quota_loan(args: argparse.Namespace, gp: GpupoolClient) -> int:
    request = gp.request_quota_loan(args.path, args.gpus, parse_until(args.until), args.reason, args.model)
    emit(args, request, lambda: (f"asked for a loan of {args.gpus} {args.model} GPU(s) to {args.path} until "
                                 f"{request['loan_until']}\n  a platform admin decides: gpupool approvals approve "
                                 f"{request['approval_id']}"))
    return EXIT_OK


def cmd_quota_loans(args: argparse.Namespace, gp: GpupoolClient) -> int:
    loans = gp.list_quota_loans(active=args.active)
    emit(args, loans, lambda: table(("PATH", "MODEL", "GPUS", "UNTIL", "ACTIVE", "GRANTED BY", "REASON"), [
        (x["path"], x["gpu_model"], x["gpus"], x["until"], "yes" if x["active"] else "no", x["granted_by"],
         _short(x["reason"], 40)) for x in loans]) if loans else "No quota loans.")
    return EXIT_OK


def cmd_priority_classes_list(args: argparse.Namespace, gp: GpupoolClient) -> int:
    classes = gp.list_priority_classes()
    emit(args, raws(classes), lambda: table(
        ["NAME", "VALUE", "PREEMPTIBLE", "MIN RUNTIME", "DESCRIPTION"],
        [[c.name, c.value, c.preemptible, fmt_duration(c.min_runtime_s), c.description] for c in classes])
        if classes else "No priority classes.")
    return EXIT_OK


def cmd_priority_classes_set(args: argparse.Namespace, gp: GpupoolClient) -> int:
    """Changes only the fields given; a new class needs --value and --preemptible or --no-preemptible."""
    current = next((c for c in gp.list_priority_classes() if c.name == args.name), None)
    if current is None and (args.value is None or args.preemptible is None):
        raise UsageError(f"priority class {args.name!r} is new: give --value and --preemptible or --no-preemptible")
    value = args.value if args.value is not None else current.value  # type: ignore[union-attr]
    preemptible = args.preemptible if args.preemptible is not None else current.preemptible  # type: ignore[union-attr]
    min_runtime = current.min_runtime_s if current else None
    if args.min_runtime is not None:
        min_runtime = None if args.min_runtime.strip().lower() in ("none", "0") else parse_duration(args.min_runtime)
    description = args.description if args.description is not None else (current.description if current else "")
    pc = gp.set_priority_class(args.name, value, preemptible, min_runtime_s=min_runtime, description=description)
    emit(args, pc.raw, lambda: (
        f"priority class {pc.name}: value {pc.value} · {'preemptible' if pc.preemptible else 'not preemptible'}"
        + (f" · min runtime {fmt_duration(pc.min_runtime_s)}" if pc.min_runtime_s else "")
        + (f" · {pc.description}" if pc.description else "")))
    return EXIT_OK


def _rule_text(rule: Any) -> str:
    shown = fmt_duration(float(rule.value)) if rule.rule == "runtime_over_s" and _is_number(rule.value) else rule.value
    return f"{rule.rule} {shown} ({'enabled' if rule.enabled else 'disabled'})"


def _is_number(text: str) -> bool:
    try:
        float(text)
    except (TypeError, ValueError):
        return False
    return True


def cmd_approvals_list(args: argparse.Namespace, gp: GpupoolClient) -> int:
    if args.limit is not None and args.limit <= 0:
        raise UsageError("--limit must be positive")
    items = gp.list_approvals(team=args.team, state=args.state, limit=args.limit)

    def render() -> str:
        rules = gp.approval_rules()
        foot = "rules: " + ("; ".join(_rule_text(r) for r in rules) if rules else "none (nothing needs approval)")
        if not items:
            return f"No approval requests.\n\n{foot}"
        body = table(["APPROVAL ID", "JOB ID", "NAME", "TEAM", "GPUS", "PRIORITY", "REASONS", "REQUESTED BY",
                      "STATE", "DECIDED BY", "AGE"],
                     [[a.approval_id, a.job_id, a.job_name, a.team, a.gpus, a.priority_class, "; ".join(a.reasons),
                       a.requested_by, a.state, a.decided_by, fmt_age(a.created_at)] for a in items])
        return f"{body}\n\n{foot}"

    emit(args, raws(items), render)
    return EXIT_OK


def cmd_approvals_decide(args: argparse.Namespace, gp: GpupoolClient) -> int:
    approve = args.approvals_command == "approve"
    a = gp.approve(args.approval_id, args.comment) if approve else gp.deny(args.approval_id, args.comment)
    outcome = "joins the queue" if approve else "fails with ApprovalDenied"
    emit(args, a.raw, lambda: f"approval {a.approval_id} {a.state}: job {a.job_id} ({a.team}/{a.job_name}) {outcome}")
    return EXIT_OK


def cmd_approvals_rule(args: argparse.Namespace, gp: GpupoolClient) -> int:
    value = args.value
    if value is None:
        if not args.disable:
            raise UsageError(f"give the rule's VALUE (e.g. gpupool approvals rule {args.rule} 8), or --disable")
        current = next((r for r in gp.approval_rules() if r.rule == args.rule), None)
        if current is None:
            raise UsageError(f"rule {args.rule} was never set; nothing to disable")
        value = current.value
    elif args.rule == "runtime_over_s":
        value = f"{parse_duration(value):g}"  # "8h" → "28800"
    rule = gp.set_approval_rule(args.rule, value, enabled=not args.disable)
    emit(args, rule.raw, lambda: f"rule {_rule_text(rule)}")
    return EXIT_OK


def reclaim_table(policies: Sequence[Any]) -> str:
    if not policies:
        return "No reclaim policies."
    return table(["KIND", "IDLE AFTER", "IDLE BELOW %", "GRACE", "ENFORCE MAX RUNTIME", "UPDATED"],
                 [[p.kind, fmt_duration(p.idle_after_s) or "never", num(p.idle_util_pct), fmt_duration(p.grace_s),
                   p.enforce_max_runtime, p.updated_at] for p in sorted(policies, key=lambda p: p.kind)])


def cmd_reclaim_list(args: argparse.Namespace, gp: GpupoolClient) -> int:
    policies = gp.list_reclaim_policies()
    emit(args, raws(policies), lambda: reclaim_table(policies))
    return EXIT_OK


def cmd_reclaim_set(args: argparse.Namespace, gp: GpupoolClient) -> int:
    """Changes only the fields given; the others keep the kind's current policy (or the defaults)."""
    current = next((p for p in gp.list_reclaim_policies() if p.kind == args.kind), None)
    fields: dict[str, Any] = {"idle_after_s": current.idle_after_s if current else None,
                              "idle_util_pct": current.idle_util_pct if current else 5.0,
                              "grace_s": current.grace_s if current else 300.0,
                              "enforce_max_runtime": current.enforce_max_runtime if current else True}
    if args.idle_after is not None:
        never = args.idle_after.strip().lower() in ("never", "none", "off")
        fields["idle_after_s"] = None if never else parse_duration(args.idle_after)
    if args.idle_util_pct is not None:
        if not 0 <= args.idle_util_pct <= 100:
            raise UsageError("--idle-util-pct must be between 0 and 100")
        fields["idle_util_pct"] = args.idle_util_pct
    if args.grace is not None:
        fields["grace_s"] = parse_duration(args.grace)
    if args.enforce_max_runtime is not None:
        fields["enforce_max_runtime"] = args.enforce_max_runtime
    p = gp.set_reclaim_policy(args.kind, **fields)
    emit(args, p.raw, lambda: (
        f"reclaim policy {p.kind}: "
        + (f"idle below {cell(num(p.idle_util_pct))}% for {fmt_duration(p.idle_after_s)} → warned, reclaimed after "
           f"{fmt_duration(p.grace_s)} grace" if p.idle_after_s else "never reclaimed for idleness")
        + f" · max runtime {'enforced' if p.enforce_max_runtime else 'not enforced'}"))
    return EXIT_OK


def cmd_usage(args: argparse.Namespace, gp: GpupoolClient) -> int:
    records = gp.list_usage(team=args.team, job_id=args.job)

    def render() -> str:
        if not records:
            return "No usage recorded."
        rows: list[list[Any]] = [[u.job_id, u.team, u.project, u.gpu_model, u.gpu_count, round(u.gpu_seconds),
                                  u.started_at, u.ended_at, u.release_reason] for u in records]
        total = sum(u.gpu_seconds for u in records)
        return (table(["JOB", "TEAM", "PROJECT", "MODEL", "GPUS", "GPU-SECONDS", "STARTED", "ENDED", "REASON"],
                      rows)
                + f"\n\ntotal: {total:.0f} GPU-seconds ({total / 3600:.2f} GPU-hours) in {len(records)} "
                  "allocation(s)")

    emit(args, raws(records), render)
    return EXIT_OK


def cmd_token_create(args: argparse.Namespace, gp: GpupoolClient) -> int:
    if args.expires_in_days is not None and args.expires_in_days <= 0:
        raise UsageError("--expires-in-days must be a positive number of days")
    tok = gp.create_token(args.name, args.role, team=args.team, expires_in_days=args.expires_in_days,
                          never_expires=args.never_expires)
    emit(args, tok.raw, lambda: (
        key_values([("Token ID", tok.token_id), ("Name", tok.name), ("Role", tok.role), ("Team", tok.team),
                    ("Expires", tok.expires_at or "never")])
        + f"\n\nSecret (shown only this once; store it now):\n  {tok.token}"))
    return EXIT_OK


def _token_status(t: Any) -> str:
    if t.revoked_at:
        return "revoked"
    if t.expires_at and t.expires_at <= datetime.now(UTC):
        return "expired"
    return "active"


def cmd_token_list(args: argparse.Namespace, gp: GpupoolClient) -> int:
    tokens = gp.list_tokens()
    emit(args, raws(tokens), lambda: table(
        ["TOKEN ID", "NAME", "ROLE", "TEAM", "STATUS", "CREATED BY", "EXPIRES", "LAST USED"],
        [[t.token_id, t.name, t.role, t.team, _token_status(t), t.created_by, t.expires_at or "never",
          t.last_used_at] for t in tokens]) if tokens else "No tokens.")
    return EXIT_OK


def cmd_token_revoke(args: argparse.Namespace, gp: GpupoolClient) -> int:
    gp.revoke_token(args.token_id)
    emit(args, {"token_id": args.token_id, "revoked": True}, lambda: f"token {args.token_id} revoked")
    return EXIT_OK


def _short(value: Any, width: int = 60) -> str:
    if value is None:
        return "-"
    text = json.dumps(value, separators=(",", ":"), default=str) if not isinstance(value, str) else value
    return text if len(text) <= width else text[: width - 1] + "…"


def cmd_audit(args: argparse.Namespace, gp: GpupoolClient) -> int:
    if args.limit <= 0:
        raise UsageError("--limit must be positive")
    entries = gp.audit(limit=args.limit, action=args.action)
    emit(args, raws(entries), lambda: table(
        ["AT", "ACTOR", "ROLE", "ACTION", "TARGET", "BEFORE", "AFTER"],
        [[e.at, e.actor, e.actor_role, e.action, e.target, _short(e.before, 40), _short(e.after, 40)]
         for e in entries]) if entries else "No audit entries.")
    return EXIT_OK


def cmd_whoami(args: argparse.Namespace, gp: GpupoolClient) -> int:
    me = gp.whoami()
    emit(args, me.raw, lambda: key_values([("Subject", me.subject), ("Role", me.role), ("Team", me.team),
                                           ("Via", me.via), ("Gateway", gp.base_url),
                                           ("Allowed", ", ".join(me.allowed) or None)]))
    return EXIT_OK


# --- shell completion -------------------------------------------------------------------------------------------------
FILE_DESTS = {"file", "data_dir", "out"}


def completion_spec(parser: argparse.ArgumentParser) -> dict[str, dict[str, Any]]:
    """For every command path ("" for the top, "token create" ...): the words to offer (subcommands and positional
    choices), its subcommands alone (they extend the path), its options, which options take a value, the choices
    of those, and which complete file names."""
    spec: dict[str, dict[str, Any]] = {}

    def walk(p: argparse.ArgumentParser, path: str) -> None:
        entry: dict[str, Any] = {"words": [], "subs": [], "options": [], "takes_value": [], "choices": {},
                                 "files": []}
        spec[path] = entry
        for action in p._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, child in action.choices.items():
                    entry["words"].append(name)
                    entry["subs"].append(name)
                    walk(child, f"{path} {name}".strip())
                continue
            if not action.option_strings:
                if action.choices:
                    entry["words"].extend(str(c) for c in action.choices)
                continue
            entry["options"].extend(action.option_strings)
            if action.nargs != 0:
                entry["takes_value"].extend(action.option_strings)
                for opt in action.option_strings:
                    if action.choices:
                        entry["choices"][opt] = [str(c) for c in action.choices]
                    elif action.dest in FILE_DESTS or action.type is Path:
                        entry["files"].append(opt)

    walk(parser, "")
    return spec


def _case_fn(name: str, cases: list[tuple[list[str], str]], default: str = "") -> str:
    lines = [f"_gpupool_{name}() {{", '    case "$1" in']
    for keys, body in cases:
        lines.append("        " + "|".join(json.dumps(k) for k in keys) + f") {body} ;;")
    if default:
        lines.append(f"        *) {default} ;;")
    lines += ["    esac", "}"]
    return "\n".join(lines)


def _helpers(spec: dict[str, dict[str, Any]]) -> str:
    def words(ws: Iterable[str]) -> str:
        return "echo " + json.dumps(" ".join(ws))

    fns = [
        _case_fn("words", [([path], words(e["words"])) for path, e in spec.items() if e["words"]]),
        _case_fn("subs", [([path], words(e["subs"])) for path, e in spec.items() if e["subs"]]),
        _case_fn("opts", [([path], words(e["options"])) for path, e in spec.items() if e["options"]]),
        _case_fn("choices", [([f"{path}|{opt}"], words(ch)) for path, e in spec.items()
                             for opt, ch in e["choices"].items()]),
        _case_fn("takes_value", [([f"{path}|{o}" for o in e["takes_value"]], "return 0")
                                 for path, e in spec.items() if e["takes_value"]], "return 1"),
        _case_fn("files", [([f"{path}|{o}" for o in e["files"]], "return 0")
                           for path, e in spec.items() if e["files"]], "return 1"),
    ]
    return "\n\n".join(fns)


_BODY = r"""
    local cmdpath="" w i skip=0 subs
    for ((i=FIRST; i<LAST; i++)); do
        w="${WORDS[i]}"
        if (( skip )); then skip=0; continue; fi
        case "$w" in
            --*=*) continue ;;
            -*) _gpupool_takes_value "$cmdpath|$w" && skip=1; continue ;;
        esac
        subs=" $(_gpupool_subs "$cmdpath") "  # a subcommand extends the path; a positional choice does not
        if [[ "$subs" == *" $w "* ]]; then cmdpath="${cmdpath:+$cmdpath }$w"; fi
    done
"""


def completion_script(shell: str, parser: argparse.ArgumentParser) -> str:
    spec = completion_spec(parser)
    helpers = _helpers(spec)
    if shell == "bash":
        body = _BODY.replace("FIRST", "1").replace("LAST", "COMP_CWORD").replace("WORDS", "COMP_WORDS")
        return f"""# bash completion for gpupool; generated by `gpupool completion bash`.
# Enable: source <(gpupool completion bash)   (or write it to /etc/bash_completion.d/gpupool)
{helpers}

_gpupool() {{
    local cur="${{COMP_WORDS[COMP_CWORD]}}" prev="${{COMP_WORDS[COMP_CWORD-1]}}"
{body}
    COMPREPLY=()
    if [[ "$prev" == -* ]] && _gpupool_takes_value "$cmdpath|$prev"; then
        local choices; choices="$(_gpupool_choices "$cmdpath|$prev")"
        if [[ -n "$choices" ]]; then
            COMPREPLY=($(compgen -W "$choices" -- "$cur"))
        elif _gpupool_files "$cmdpath|$prev"; then
            COMPREPLY=($(compgen -f -- "$cur"))
        fi
        return 0
    fi
    if [[ "$cur" == -* ]]; then
        COMPREPLY=($(compgen -W "$(_gpupool_opts "$cmdpath")" -- "$cur"))
    else
        COMPREPLY=($(compgen -W "$(_gpupool_words "$cmdpath")" -- "$cur"))
    fi
    return 0
}}
complete -F _gpupool gpupool
"""
    if shell == "zsh":
        body = _BODY.replace("FIRST", "2").replace("LAST", "CURRENT").replace("WORDS", "words")
        return f"""#compdef gpupool
# zsh completion for gpupool; generated by `gpupool completion zsh`.
# Enable: gpupool completion zsh > "${{fpath[1]}}/_gpupool"   (or: source <(gpupool completion zsh) after compinit)
{helpers}

_gpupool() {{
    local cur="${{words[CURRENT]}}" prev="${{words[CURRENT-1]}}"
{body}
    if [[ "$prev" == -* ]] && _gpupool_takes_value "$cmdpath|$prev"; then
        local choices; choices="$(_gpupool_choices "$cmdpath|$prev")"
        if [[ -n "$choices" ]]; then
            compadd -- ${{=choices}}
        elif _gpupool_files "$cmdpath|$prev"; then
            _files
        fi
        return 0
    fi
    if [[ "$cur" == -* ]]; then
        compadd -- ${{=$(_gpupool_opts "$cmdpath")}}
    else
        compadd -- ${{=$(_gpupool_words "$cmdpath")}}
    fi
}}

if [[ "${{funcstack[1]}}" == "_gpupool" ]]; then
    _gpupool "$@"
else
    compdef _gpupool gpupool
fi
"""
    raise UsageError(f"unknown shell {shell!r} (bash or zsh)")


def cmd_completion(args: argparse.Namespace) -> int:
    from libs.cli.main import build_parser

    print(completion_script(args.shell, build_parser()), end="")
    return EXIT_OK


# --- nodes: cordon, drain, sharing, GPU health, orphans (operators) ---------------------------------------------------
SHARING_MODES = ("exclusive", "fractional", "mig")


def node_text(n: Node) -> str:
    cordon = "no"
    if n.cordoned:
        info = n.cordon or {}
        cordon = ("drained" if n.drained else "cordoned") + (f" by {info['by']}" if info.get("by") else "") + \
            (f": {info['reason']}" if info.get("reason") else "")
    net, st = n.network, n.storage
    throughput = None if net.rx_mbps is None and net.tx_mbps is None else \
        "rx {} / tx {} Mbit/s".format(*("-" if v is None else f"{v:.0f}" for v in (net.rx_mbps, net.tx_mbps)))
    volumes = ", ".join(f"{v.mount} {fmt_tib(v.total_gib)} TiB" + (f" {v.filesystem}" if v.filesystem else "")
                        for v in st.volumes)
    head = key_values([("node", f"{n.cluster}/{n.node}"), ("state", n.state), ("cordoned", cordon),
                       ("cpus", n.cpu_count), ("cpu use %", n.cpu_util_pct),
                       ("memory GiB", f"{fmt_gib(n.memory_used_mib)}/{fmt_gib(n.memory_mib)} used"
                        if n.memory_used_mib is not None else fmt_gib(n.memory_mib)),
                       ("network", f"{fmt_network(net)} ({num(net.link_gbps)} Gbit/s)" if net.interfaces else None),
                       ("throughput", throughput),
                       ("storage", f"{fmt_storage(st)} used" if st.volumes else None),
                       ("volumes", volumes or None),
                       ("last seen", fmt_age(n.last_seen_at) + " ago" if n.last_seen_at else None)])
    rows = [[g.index, g.model, g.state, g.state_reason or None, fmt_age(g.state_since) if g.state_since else None,
             g.sharing, num(g.telemetry.utilization_gpu_pct) if g.telemetry else None,
             g.telemetry.process_count if g.telemetry else None, g.allocation_id] for g in n.gpus]
    return head + "\n\n" + table(["GPU", "MODEL", "STATE", "WHY", "FOR", "SHARING", "UTIL %", "PROCS", "ALLOCATION"],
                                  rows)


def cmd_node(args: argparse.Namespace, gp: GpupoolClient) -> int:
    n = gp.get_node(args.node, cluster=args.cluster)
    emit(args, n.raw, lambda: node_text(n))
    return EXIT_OK


def cmd_cordon(args: argparse.Namespace, gp: GpupoolClient) -> int:
    """cordon / uncordon / drain share one function: the subcommand's name is the action."""
    action = args.node_action
    if action == "uncordon":
        n = gp.uncordon(args.node, cluster=args.cluster)
    else:
        n = getattr(gp, action)(args.node, reason=args.reason or "", cluster=args.cluster)
    state = "drained" if n.drained else "cordoned" if n.cordoned else "schedulable"
    emit(args, n.raw, lambda: f"node {n.cluster}/{n.node} is {state}")
    return EXIT_OK


def cmd_sharing(args: argparse.Namespace, gp: GpupoolClient) -> int:
    out = gp.set_gpu_sharing(args.node, args.gpu, args.mode, cluster=args.cluster)
    emit(args, out.raw, lambda: f"GPU {out.index} on {out.cluster}/{out.node}: {out.mode}"
                                + (f", draining to {out.draining_to} (no new work; switches once its work is "
                                   "released)" if out.draining_to else "" if out.changed else " (unchanged)"))
    return EXIT_OK


def cmd_gpu_health(args: argparse.Namespace, gp: GpupoolClient) -> int:
    out = gp.set_gpu_health(args.node, args.gpu, args.action, reason=args.reason or "", cluster=args.cluster)
    emit(args, out.raw, lambda: f"GPU {out.index} on {out.cluster}/{out.node}: {out.before} -> {out.state}"
                                + ("" if out.changed else " (unchanged)"))
    return EXIT_OK


def cmd_orphans(args: argparse.Namespace, gp: GpupoolClient) -> int:
    items = gp.list_orphans(cluster=args.cluster, open_only=not args.all, limit=args.limit)
    emit(args, raws(items), lambda: table(
        ["KIND", "NODE", "GPU", "ALLOCATION", "JOB", "TEAM", "SINCE", "RESOLVED"],
        [[o.kind, f"{o.cluster}/{o.node}", o.gpu_uuid, o.allocation_id, o.job_id, o.team, o.since, o.resolved_at]
         for o in items]) if items else "No orphans.")
    return EXIT_OK


def register_node_commands(add: Callable[..., argparse.ArgumentParser]) -> None:
    """gpupool node | cordon | uncordon | drain | sharing | gpu-health | orphans."""
    def node_args(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
        p.add_argument("node", metavar="NODE")
        p.add_argument("--cluster", help="needed only when the node name exists in several clusters")
        return p

    node_args(add("node", cmd_node, "one node: its GPUs' health state, sharing mode, holder and telemetry"))
    for action, text in (("cordon", "cordon a node: no new work is placed on it (running work stays)"),
                         ("drain", "drain a node: cordon it and take its allocations back (jobs are requeued)"),
                         ("uncordon", "uncordon a node: it takes new work again")):
        p = node_args(add(action, cmd_cordon, text + " (operators, admins)"))
        p.set_defaults(node_action=action)
        if action != "uncordon":
            p.add_argument("--reason", help="why (recorded with the node and in the audit log)")
    p = node_args(add("sharing", cmd_sharing, "set how one GPU is shared: exclusive, fractional or mig (operators, "
                                              "admins)"))
    p.add_argument("gpu", metavar="GPU", type=int, help="the GPU's index on the node")
    p.add_argument("mode", metavar="MODE", choices=SHARING_MODES)
    p = node_args(add("gpu-health", cmd_gpu_health, "clear a GPU's quarantine (it enters probation) or quarantine it "
                                                    "now (operators, admins)"))
    p.add_argument("gpu", metavar="GPU", type=int, help="the GPU's index on the node")
    p.add_argument("action", metavar="ACTION", choices=("clear", "quarantine"))
    p.add_argument("--reason", help="why (recorded with the GPU and in the audit log)")
    p = add("orphans", cmd_orphans, "processes on GPUs no allocation holds; allocations whose GPUs run no process")
    p.add_argument("--cluster")
    p.add_argument("--all", action="store_true", help="also those that have since resolved")
    p.add_argument("--limit", type=int, help="show at most this many")


# --- wiring ---------------------------------------------------------------------------------------------------------
def fail(message: str, code: int) -> int:
    print(f"error: {message}", file=sys.stderr)
    return code


def run_api(func: Callable[[argparse.Namespace, GpupoolClient], int]) -> Callable[[argparse.Namespace], int]:
    """Wrap a command: build the client, run, and turn every failure into one line on stderr and an exit code."""

    def runner(args: argparse.Namespace) -> int:
        try:
            gp = make_client(args)
            try:
                return func(args, gp)
            finally:
                gp.close()
        except ConfigError as exc:
            return fail(exc.detail, EXIT_USAGE)
        except UsageError as exc:
            return fail(str(exc), EXIT_USAGE)
        except GpupoolError as exc:
            return fail(str(exc), EXIT_UNREACHABLE if exc.unreachable else EXIT_API)
        except KeyboardInterrupt:
            return fail("interrupted", 130)
        except BrokenPipeError:  # `gpupool jobs | head`
            try:
                sys.stdout = open(os.devnull, "w")  # silence the flush at exit
            except OSError:
                pass
            return EXIT_OK
        except Exception as exc:  # a bug in the CLI or a response it cannot read: still one line, no traceback
            if os.environ.get("GPUPOOL_DEBUG"):
                raise
            text = " ".join(str(exc).split())[:300]
            return fail(f"unexpected {type(exc).__name__}: {text} (set GPUPOOL_DEBUG=1 for a traceback)", EXIT_API)

    runner.__name__ = func.__name__
    return runner


def _common() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    g = common.add_argument_group("connection and output")
    g.add_argument("--url", help="gateway URL (default $GPUPOOL_URL, else run.json of `gpupool up`)")
    g.add_argument("--token", help="API token (default $GPUPOOL_TOKEN, else the admin token in run.json)")
    g.add_argument("-o", "--output", choices=("table", "json"), default="table", help="output format")
    return common


def register(sub: argparse._SubParsersAction) -> None:
    """Add the people-facing commands to the `gpupool` parser's subcommands."""
    common = _common()

    def add(name: str, func: Callable[[argparse.Namespace, GpupoolClient], int], text: str,
            parent: argparse._SubParsersAction = sub) -> argparse.ArgumentParser:
        p = parent.add_parser(name, help=text, description=text, parents=[common])
        p.set_defaults(func=run_api(func))
        return p

    from libs.cli import work

    work.register(sub, add)  # submit, run, logs
    from libs.cli import services

    services.register(add)  # endpoints, load, update

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

    p = add("nodes", cmd_nodes, "nodes with GPU counts, health and last telemetry")
    p.add_argument("--cluster")

    p = add("pool", cmd_pool, "GPUs per cluster and model: allocated, used, allocated-but-idle, unhealthy, free")
    p.add_argument("--cluster")
    p.add_argument("--fragmentation", action="store_true",
                   help="free GPUs that no recently asked-for job shape could use (FGD's measure)")

    p = add("top", cmd_top, "live per-GPU view: utilization, memory, temperature, power, health, holder")
    p.add_argument("--interval", type=float, default=2.0, help="seconds between refreshes (default 2)")
    p.add_argument("--once", action="store_true", help="print one frame and exit")
    p.add_argument("--cluster")

    def group(name: str, text: str, dest: str, choices: str) -> argparse._SubParsersAction:
        g = sub.add_parser(name, help=text, description=text)
        return g.add_subparsers(dest=dest, required=True, metavar="{" + choices + "}")

    teams = add("teams", cmd_teams, "teams and their quotas (`teams create NAME` adds one)")
    teams_sub = teams.add_subparsers(dest="teams_command", metavar="{list,create}")
    add("list", cmd_teams, "teams and their quotas", teams_sub)
    p = add("create", cmd_teams_create, "create a team (and its org) (admins)", teams_sub)
    p.add_argument("name", metavar="NAME")
    p.add_argument("--org", help="the org it belongs to (default: default)")

    quota = group("quota", "quota entries of the org → team → project tree, in GPUs", "quota_command",
                  "list,set,delete,loan,loans")
    add("list", cmd_quota_list, "every quota entry", quota)
    p = add("set", cmd_quota_set, "set one quota entry; fields not given keep their value (admins)", quota)
    p.add_argument("path", metavar="PATH", help="org, org/team or org/team/project, e.g. default/research")
    p.add_argument("--model", default="*", help="GPU model, '*' (the default) for any model")
    p.add_argument("--guaranteed", type=float, default=_UNSET, metavar="GPUS", help="GPUs guaranteed")
    p.add_argument("--borrowing-limit", type=parse_limit, default=_UNSET, metavar="GPUS",
                   help="GPUs it may borrow beyond its guarantee, or 'unlimited'")
    p.add_argument("--lending-limit", type=parse_limit, default=_UNSET, metavar="GPUS",
                   help="unused guaranteed GPUs it lends to others, or 'all'")
    p.add_argument("--weight", type=float, default=_UNSET, help="over-quota fair-share weight (default 1)")
    p = add("delete", cmd_quota_delete, "remove one quota entry (admins)", quota)
    p.add_argument("path", metavar="PATH")
    p.add_argument("--model", default="*", help="GPU model, '*' (the default) for any model")
    p = add("loan", cmd_quota_loan, "ask for extra guarantee until a date (team admins; a platform admin approves)",
            quota)
    p.add_argument("path", metavar="PATH", help="org/team or org/team/project, e.g. default/research")
    p.add_argument("--gpus", type=int, required=True, help="extra guaranteed GPUs")
    p.add_argument("--until", required=True, metavar="WHEN", help="a date (2026-12-24) or a duration (7d, 12h)")
    p.add_argument("--reason", required=True)
    p.add_argument("--model", default="*", help="GPU model, '*' (the default) for any model")
    p = add("loans", cmd_quota_loans, "quota loans granted", quota)
    p.add_argument("--active", action="store_true", help="only those in force now")

    classes = group("priority-classes", "priority classes: higher value runs first", "pc_command", "list,set")
    add("list", cmd_priority_classes_list, "every priority class", classes)
    p = add("set", cmd_priority_classes_set, "create or change a priority class; fields not given keep their value "
                                             "(admins)", classes)
    p.add_argument("name", metavar="NAME")
    p.add_argument("--value", type=int, help="higher runs first")
    p.add_argument("--preemptible", action=argparse.BooleanOptionalAction, default=None,
                   help="whether jobs of this class may be preempted")
    p.add_argument("--min-runtime", metavar="DURATION", help="run at least this long before preemption, or none")
    p.add_argument("--description")

    approvals = group("approvals", "approval requests and the rules that send big jobs to them", "approvals_command",
                      "list,approve,deny,rule")
    p = add("list", cmd_approvals_list, "approval requests (newest first) and the rules in force", approvals)
    p.add_argument("--team")
    p.add_argument("--state", choices=APPROVAL_STATES)
    p.add_argument("--limit", type=int, help="show at most this many")
    for verb, text in (("approve", "approve a request: its job joins the queue"),
                       ("deny", "deny a request: its job fails with ApprovalDenied")):
        p = add(verb, cmd_approvals_decide, text, approvals)
        p.add_argument("approval_id", metavar="APPROVAL_ID")
        p.add_argument("--comment", default="", help="recorded with the decision")
    p = add("rule", cmd_approvals_rule, "set an admission rule that requires approval (admins)", approvals)
    p.add_argument("rule", metavar="RULE", choices=APPROVAL_RULES,
                   help="gpus_over (GPUs), runtime_over_s (declared max runtime; 8h works) or priority_class")
    p.add_argument("value", metavar="VALUE", nargs="?", help="the threshold or class name")
    p.add_argument("--disable", action="store_true", help="stop applying the rule (keeps its value)")

    reclaim = group("reclaim-policies", "what is taken back, per job kind", "reclaim_command", "list,set")
    add("list", cmd_reclaim_list, "the policy of every job kind", reclaim)
    p = add("set", cmd_reclaim_set, "set a kind's policy; fields not given keep their value (admins)", reclaim)
    p.add_argument("kind", metavar="KIND", choices=JOB_KINDS)
    p.add_argument("--idle-after", metavar="DURATION", help="warn after this long idle, e.g. 30m, or 'never'")
    p.add_argument("--idle-util-pct", type=float, metavar="PCT", help="idle means GPU utilization below this")
    p.add_argument("--grace", metavar="DURATION", help="time between the warning and the reclaim")
    p.add_argument("--enforce-max-runtime", action=argparse.BooleanOptionalAction, default=None,
                   help="end jobs that run past their declared --max-runtime")

    p = add("usage", cmd_usage, "the GPU-seconds ledger")
    p.add_argument("--team")
    p.add_argument("--job", help="one job's usage")
    register_reports(sub, common)

    token = sub.add_parser("token", help="API tokens: create, list, revoke (admins)",
                           description="API tokens: create, list, revoke (admins)")
    token_sub = token.add_subparsers(dest="token_command", required=True, metavar="{create,list,revoke}")
    p = add("create", cmd_token_create, "create a token; its secret is shown once", token_sub)
    p.add_argument("--name", required=True)
    p.add_argument("--role", required=True, choices=ROLES)
    p.add_argument("--team", help="the team a team-admin/member/viewer token acts for")
    exp = p.add_mutually_exclusive_group()
    exp.add_argument("--expires-in-days", type=int, help="default: the gateway's (90 days)")
    exp.add_argument("--never-expires", action="store_true", help="a token without expiry")
    add("list", cmd_token_list, "list tokens (never their secrets)", token_sub)
    p = add("revoke", cmd_token_revoke, "revoke a token now", token_sub)
    p.add_argument("token_id", metavar="TOKEN_ID")

    p = add("audit", cmd_audit, "the audit log of administrative actions, newest as the gateway orders them")
    p.add_argument("--limit", type=int, default=50, help="at most this many entries (default 50)")
    p.add_argument("--action", help="only this action, e.g. token.create")

    add("whoami", cmd_whoami, "who the token authenticates as, and what it may do")
    register_node_commands(add)

    from libs.cli import decisions

    decisions.register(sub, add)

    p = sub.add_parser("completion", help="print a shell completion script (bash or zsh)",
                       description="print a shell completion script: source <(gpupool completion bash)")
    p.add_argument("shell", choices=("bash", "zsh"))
    p.set_defaults(func=cmd_completion)


# --- reports and cost rates -----------------------------------------------------------------------------------------
REPORT_DIMENSIONS = ("team", "project", "user", "kind", "gpu_model", "sharing", "mig_profile")
_NUMBER = re.compile(r"^-?\d+(\.\d+)?%?$")


def parse_when(text: str, now: datetime | None = None) -> datetime:
    """A report bound: an ISO date or time ("2026-03-01", "2026-03-01T08:00:00Z", no zone = UTC), "now", or a
    duration before now ("7d", "12h", "1h30m")."""
    now = now or datetime.now(UTC)
    raw = text.strip()
    if raw.lower() == "now":
        return now
    try:
        value = datetime.fromisoformat(raw.replace("Z", "+00:00") if raw.endswith("Z") else raw)
    except ValueError:
        try:
            return now - timedelta(seconds=parse_duration(raw))
        except UsageError:
            raise UsageError(f"{text!r} is not a time (2026-03-01, 2026-03-01T08:00Z, now, or an age like 7d, "
                             "12h)") from None
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


def _fmt(value: Any, digits: int = 3) -> Any:
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return value


def report_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """Like `table`, but numbers already formatted as text (fixed decimals) still align right."""
    text = [[cell(v) for v in r] for r in rows]
    right = [bool(text) and all(_NUMBER.match(r[i]) or r[i] == "-" for r in text) for i in range(len(headers))]
    widths = [max([len(h)] + [len(r[i]) for r in text]) for i, h in enumerate(headers)]
    out = []
    for line in [list(headers), *text]:
        parts = [c.rjust(widths[i]) if right[i] else c.ljust(widths[i]) for i, c in enumerate(line)]
        out.append("  ".join(parts).rstrip())
    return "\n".join(out)


def _report_filters(args: argparse.Namespace) -> dict[str, list[str]]:
    return {dim: values for dim in REPORT_DIMENSIONS if (values := getattr(args, f"f_{dim}", None))}


def _report_range(args: argparse.Namespace) -> tuple[datetime | None, datetime | None]:
    """Both bounds from one `now`, so `--from 1h` covers exactly the last hour."""
    now = datetime.now(UTC)
    end = parse_when(args.end, now) if args.end else None
    start = parse_when(args.start, now) if args.start else None
    return start, end if end is not None or start is None else now


def _group_by(args: argparse.Namespace) -> list[str] | None:
    if args.group_by is None:
        return None
    dims = [d.strip() for d in args.group_by.split(",") if d.strip()]
    unknown = [d for d in dims if d not in REPORT_DIMENSIONS]
    if unknown:
        raise UsageError(f"unknown --group-by {', '.join(unknown)} (use {', '.join(REPORT_DIMENSIONS)})")
    return dims


def _report_out(args: argparse.Namespace, raw: Any, csv_text: Callable[[], str], render: Callable[[], str]) -> None:
    if args.csv:
        sys.stdout.write(csv_text())
    elif args.output == "json" or args.json:
        print(json.dumps(raw, indent=2, default=str))
    else:
        print(render())


def _range_line(report: Any) -> str:
    return f"{fmt_time(report.start)} → {fmt_time(report.end)} UTC (as of {fmt_time(report.as_of)})"


def cmd_report_usage(args: argparse.Namespace, gp: GpupoolClient) -> int:
    start, end = _report_range(args)
    kw = dict(group_by=_group_by(args), filters=_report_filters(args), limit=args.limit)
    report = gp.report_usage(start, end, **kw)

    def render() -> str:
        dims = report.group_by
        rows = [[*(r.dims(dims).values()), _fmt(r.gpu_hours), _fmt(r.gpu_seconds, 1), _fmt(r.cost, 2),
                 _fmt(r.avg_utilization_pct, 1), r.allocations, r.jobs] for r in report.rows]
        head = [d.upper().replace("_", "-") for d in dims]
        total = report.total
        body = report_table([*head, "GPU-HOURS", "GPU-SECONDS", f"COST ({report.currency})", "UTIL%", "ALLOCS",
                             "JOBS"], rows) if rows else "No usage in this range."
        foot = (f"\n\ntotal: {_fmt(total.gpu_hours)} GPU-hours, {_fmt(total.cost, 2)} {report.currency}"
                + (f" ({_fmt(total.unpriced_gpu_seconds, 1)} GPU-seconds without a price)"
                   if total and total.unpriced_gpu_seconds else "")
                + f" · {_range_line(report)}" + (" · more groups than --limit" if report.truncated else "")) \
            if total else ""
        return body + foot

    _report_out(args, report.raw, lambda: gp.report_usage_csv(start, end, **kw), render)
    return EXIT_OK


def cmd_report_efficiency(args: argparse.Namespace, gp: GpupoolClient) -> int:
    start, end = _report_range(args)
    kw = dict(group_by=_group_by(args), filters=_report_filters(args), limit=args.limit)
    report = gp.report_efficiency(start, end, **kw)

    def render() -> str:
        dims = report.group_by
        rows = [[*(r.dims(dims).values()), _fmt(r.allocated_gpu_hours), _fmt(r.used_gpu_hours),
                 _fmt(r.idle_gpu_hours), _fmt(r.efficiency_pct, 1), _fmt(r.idle_pct, 1),
                 _fmt(r.telemetry_coverage_pct, 1)] for r in report.rows]
        head = [d.upper().replace("_", "-") for d in dims]
        body = report_table([*head, "ALLOCATED-H", "USED-H", "IDLE-H", "EFFICIENCY%", "IDLE%", "MEASURED%"],
                            rows) if rows else "No usage in this range."
        return body + f"\n\n{_range_line(report)}; idle = minutes at or below {report.idle_util_pct}% utilization"

    _report_out(args, report.raw, lambda: gp.report_efficiency_csv(start, end, **kw), render)
    return EXIT_OK


def cmd_report_waste(args: argparse.Namespace, gp: GpupoolClient) -> int:
    start, end = _report_range(args)
    kw = dict(filters=_report_filters(args), min_idle_fraction=args.min_idle_fraction, limit=args.limit)
    report = gp.report_waste(start, end, **kw)

    def render() -> str:
        parts = [f"idle GPU-hours: {_fmt(report.idle_gpu_hours)} · {_range_line(report)}"]
        if report.by_team:
            parts.append(report_table(["TEAM", "ALLOCATED-H", "IDLE-H", "IDLE%"], [
                [r.raw.get("team"), _fmt(r.allocated_gpu_hours), _fmt(r.idle_gpu_hours), _fmt(r.idle_pct, 1)]
                for r in report.by_team]))
        if report.idle_allocations:
            parts.append(f"allocations idle at least {report.min_idle_fraction:.0%} of the measured time:\n"
                         + report_table(["ALLOCATION", "JOB", "TEAM", "USER", "KIND", "NODE", "MODEL", "GPUS",
                                         "IDLE-H", "IDLE%", "UTIL%", "STATE"], [
                             [a.allocation_id, a.job_id, a.team, a.user, a.kind, a.node, a.gpu_model,
                              num(a.gpu_share), _fmt(a.idle_gpu_hours), _fmt(100 * a.idle_fraction, 1),
                              _fmt(a.avg_utilization_pct, 1),
                              "running" if a.running else (a.release_reason or "released")]
                             for a in report.idle_allocations]))
        else:
            parts.append("No idle allocations.")
        if report.orphans:
            parts.append("orphans:\n" + report_table(["GPU", "NODE", "ORPHAN", "ALLOCATION", "TEAM", "PIDS", "SINCE"], [
                [o.gpu_uuid, o.node, o.orphan, o.allocation_id, o.team, o.pids, o.since] for o in report.orphans]))
        return "\n\n".join(parts)

    _report_out(args, report.raw, lambda: gp.report_waste_csv(start, end, **kw), render)
    return EXIT_OK


def cmd_cost_rates_list(args: argparse.Namespace, gp: GpupoolClient) -> int:
    rates = gp.list_cost_rates(gpu_model=args.model)
    emit(args, raws(rates), lambda: report_table(
        ["MODEL", "MIG-PROFILE", "FROM", "PRICE/HOUR", "SET-BY"],
        [[r.gpu_model, r.mig_profile, r.effective_from, f"{r.price_per_hour:g}", r.set_by] for r in rates])
        if rates else "No prices set.")
    return EXIT_OK


def cmd_cost_rates_set(args: argparse.Namespace, gp: GpupoolClient) -> int:
    rate = gp.set_cost_rate(args.model, args.price, parse_when(args.start) if args.start else datetime.now(UTC),
                            mig_profile=args.mig_profile or "")
    what = f"{rate.gpu_model}{' ' + rate.mig_profile if rate.mig_profile else ''}"
    emit(args, rate.raw, lambda: f"{what}: {rate.price_per_hour:g} per "
                                 f"{'instance' if rate.mig_profile else 'GPU'}-hour from {fmt_time(rate.effective_from)}")
    return EXIT_OK


def cmd_cost_rates_delete(args: argparse.Namespace, gp: GpupoolClient) -> int:
    gp.delete_cost_rate(args.model, parse_when(args.start), mig_profile=args.mig_profile or "")
    emit(args, None, lambda: f"price of {args.model} from {args.start} withdrawn")
    return EXIT_OK


def register_reports(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    """`gpupool report usage|efficiency|capacity|waste` and `gpupool cost-rates list|set|delete`."""

    def add(parent: argparse._SubParsersAction, name: str, func: Callable[[argparse.Namespace, GpupoolClient], int],
            text: str) -> argparse.ArgumentParser:
        p = parent.add_parser(name, help=text, description=text, parents=[common])
        p.set_defaults(func=run_api(func))
        return p

    def window(p: argparse.ArgumentParser, default: str) -> None:
        p.add_argument("--from", dest="start", metavar="WHEN",
                       help=f"start: 2026-03-01, 2026-03-01T08:00Z, or an age like 7d (default: {default} before --to)")
        p.add_argument("--to", dest="end", metavar="WHEN", help="end, exclusive (default: now)")
        fmt = p.add_mutually_exclusive_group()
        fmt.add_argument("--csv", action="store_true", help="print the report's table as CSV (for a spreadsheet)")
        fmt.add_argument("--json", action="store_true", help="print the report as JSON (same as -o json)")

    def filters(p: argparse.ArgumentParser) -> None:
        for dim, flag in (("team", "--team"), ("project", "--project"), ("user", "--user"), ("kind", "--kind"),
                          ("gpu_model", "--model"), ("sharing", "--sharing"), ("mig_profile", "--mig-profile")):
            p.add_argument(flag, dest=f"f_{dim}", action="append", metavar=dim.upper(),
                           choices=JOB_KINDS if dim == "kind" else ("whole", "fraction", "mig")
                           if dim == "sharing" else None, help=f"only this {dim.replace('_', ' ')} (repeatable)")

    report = sub.add_parser("report", help="usage and cost, efficiency, capacity, waste",
                            description="reports from the accounting ledger")
    rsub = report.add_subparsers(dest="report_command", required=True, metavar="{usage,efficiency,capacity,waste}")
    for name, func, text in (("usage", cmd_report_usage, "GPU-hours and cost per team, project, user, kind, model "
                                                          "or sharing"),
                             ("efficiency", cmd_report_efficiency, "used vs allocated GPU-hours and idle GPU-hours")):
        p = add(rsub, name, func, text)
        window(p, "7 days")
        p.add_argument("--group-by", metavar="DIMS",
                       help=f"comma-separated, any of {','.join(REPORT_DIMENSIONS)} (default team; '' for a total)")
        filters(p)
        p.add_argument("--limit", type=int, help="at most this many groups (largest first)")
    from libs.cli import capacity

    capacity.register(sub, rsub, add, window, common, run_api)
    p = add(rsub, "waste", cmd_report_waste, "idle GPU-hours by team, idle allocations by name, and orphans")
    window(p, "7 days")
    filters(p)
    p.add_argument("--min-idle-fraction", type=float, metavar="F",
                   help="list allocations idle at least this fraction of the time (0-1, default 0.5)")
    p.add_argument("--limit", type=int, help="at most this many allocations and orphans")

    rates = sub.add_parser("cost-rates", help="prices per GPU model and MIG profile, with effective dates",
                           description="prices per GPU model and MIG profile, with effective dates")
    csub = rates.add_subparsers(dest="rates_command", required=True, metavar="{list,set,delete}")
    p = add(csub, "list", cmd_cost_rates_list, "every price and when it takes effect")
    p.add_argument("--model", help="only this GPU model")
    p = add(csub, "set", cmd_cost_rates_set, "set a price from a date (admins)")
    p.add_argument("model", metavar="MODEL")
    p.add_argument("price", metavar="PRICE", help="per GPU-hour (per instance-hour with --mig-profile)")
    p.add_argument("--from", dest="start", metavar="WHEN", help="when it takes effect (default: now)")
    p.add_argument("--mig-profile", help="price one MIG profile of the model, e.g. 3g.40gb")
    p = add(csub, "delete", cmd_cost_rates_delete, "withdraw a price (admins)")
    p.add_argument("model", metavar="MODEL")
    p.add_argument("--from", dest="start", metavar="WHEN", required=True, help="the date the price takes effect")
    p.add_argument("--mig-profile")
