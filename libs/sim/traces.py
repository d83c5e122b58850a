"""Trace readers: node lists, the Alibaba GPU trace v2023 ("openb") task list, and a generic CSV.

Tenants. The openb trace has no user or team column. We assign each task a synthetic team by hashing its name with
the seed: ``u = int(sha256(f"{seed}:{name}"))[:8] / 2**32``, and team ``team-k`` is the first k whose cumulative
weight exceeds u, with weights 0.4 / 0.3 / 0.2 / 0.1 for ``team-0..team-3`` (a skewed, Zipf-like mix, as real
clusters have a few large tenants). The same seed always gives the same teams. QoS maps to priority classes:
Guaranteed -> production-inference, LS -> high, Burstable -> normal, BE -> best-effort; and to job kinds (an
assumption: the trace names none): Guaranteed and LS (latency-sensitive) -> inference, Burstable -> training,
BE -> batch.
"""

from __future__ import annotations

import csv
import hashlib
from dataclasses import dataclass
from pathlib import Path

from libs.core.model import EXCLUSIVE, FRACTIONAL, WHOLE, Gpu, JobRequest, Node

TEAMS = ("team-0", "team-1", "team-2", "team-3")
TEAM_WEIGHTS = (0.4, 0.3, 0.2, 0.1)
QOS_CLASS = {"Guaranteed": "production-inference", "LS": "high", "Burstable": "normal", "BE": "best-effort"}
QOS_KIND = {"Guaranteed": "inference", "LS": "inference", "Burstable": "training", "BE": "batch"}

# GPU memory by model where known (openb's G1/G2/G3 codes are undisclosed; 16 GiB is assumed for them).
GPU_MEMORY_MIB = {
    "P100": 16384, "T4": 16384, "V100M16": 16384, "V100M32": 32768, "A10": 24576,
    "A100-40GB": 40960, "A100-80GB": 81920, "H100-80GB": 81920, "H200-141GB": 144384,
}


@dataclass(frozen=True, slots=True)
class SimJob:
    request: JobRequest
    duration: float  # seconds of work; a preempted job restarts from the beginning

    @property
    def job_id(self) -> str:
        return self.request.job_id

    @property
    def submit(self) -> float:
        return self.request.submitted_at


def synthetic_team(name: str, seed: int) -> str:
    u = int(hashlib.sha256(f"{seed}:{name}".encode()).hexdigest()[:8], 16) / 2**32
    acc = 0.0
    for team, w in zip(TEAMS, TEAM_WEIGHTS, strict=True):
        acc += w
        if u < acc:
            return team
    return TEAMS[-1]


def _first(row: dict, *names: str, default: str = "") -> str:
    for n in names:
        v = row.get(n)
        if v is not None and v != "":
            return v
    return default


def read_nodes(path: str | Path, sharing: str = FRACTIONAL, include_cpu_only: bool = False) -> list[Node]:
    """Node list CSV: ``sn|name, cpu_milli, memory_mib, gpu|num_gpu|gpus, model`` (openb format). Each GPU gets
    `sharing` (openb is a GPU-sharing cluster, so fractional by default)."""
    nodes = []
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            name = _first(row, "sn", "name", "node")
            n = int(float(_first(row, "gpu", "num_gpu", "gpus", default="0")))
            if n == 0 and not include_cpu_only:
                continue
            model = _first(row, "model", "gpu_model", default="GPU")
            mem = GPU_MEMORY_MIB.get(model, 16384)
            gpus = tuple(
                Gpu(f"{name}/gpu{i}", i, model, mem, sharing=sharing if sharing in (EXCLUSIVE, FRACTIONAL) else
                    EXCLUSIVE)
                for i in range(n)
            )
            nodes.append(Node(name, "sim", gpus, cpu_milli=int(float(_first(row, "cpu_milli", default="0"))),
                              memory_mib=int(float(_first(row, "memory_mib", default="0")))))
    return nodes


@dataclass(frozen=True, slots=True)
class Task:
    """One row of an openb-style task list (only the columns the fill experiment needs are required)."""

    name: str
    cpu_milli: int
    memory_mib: int
    num_gpu: int
    gpu_milli: int
    gpu_spec: tuple[str, ...] = ()
    qos: str = ""
    creation: float | None = None
    deletion: float | None = None
    scheduled: float | None = None

    @property
    def gpu_demand(self) -> float:
        """GPUs this task asks for (a fraction when shared)."""
        return self.num_gpu * self.gpu_milli / WHOLE if self.num_gpu else 0.0

    def request(self, job_id: str, submitted_at: float, team: str, **kw) -> JobRequest:
        common = dict(cpu_milli=self.cpu_milli, memory_mib=self.memory_mib, gpu_models=self.gpu_spec,
                      priority_class=QOS_CLASS.get(self.qos, "normal"), kind=QOS_KIND.get(self.qos, "batch"))
        common.update(kw)
        if self.num_gpu == 1 and 0 < self.gpu_milli < WHOLE:
            return JobRequest(job_id, team, 1, submitted_at, gpu_fraction_milli=self.gpu_milli, **common)
        return JobRequest(job_id, team, self.num_gpu, submitted_at, **common)


def _opt(v: str | None) -> float | None:
    return float(v) if v not in (None, "") else None


def read_tasks(path: str | Path) -> list[Task]:
    """openb task list: ``name,cpu_milli,memory_mib,num_gpu,gpu_milli`` required; ``gpu_spec`` (models separated by
    ``|``), ``qos``, ``creation_time``, ``deletion_time``, ``scheduled_time`` honoured when present."""
    out = []
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            num_gpu = int(float(_first(row, "num_gpu", default="0")))
            milli = int(float(_first(row, "gpu_milli", default="1000" if num_gpu else "0")))
            spec = tuple(s for s in _first(row, "gpu_spec").split("|") if s)
            out.append(Task(
                name=_first(row, "name"),
                cpu_milli=int(float(_first(row, "cpu_milli", default="0"))),
                memory_mib=int(float(_first(row, "memory_mib", default="0"))),
                num_gpu=num_gpu,
                gpu_milli=milli if num_gpu else 0,
                gpu_spec=spec,
                qos=_first(row, "qos"),
                creation=_opt(row.get("creation_time")),
                deletion=_opt(row.get("deletion_time")),
                scheduled=_opt(row.get("scheduled_time")),
            ))
    return out


def openb_jobs(tasks: list[Task], seed: int = 0) -> list[SimJob]:
    """Timed jobs from an openb task list: submit = creation_time, duration = deletion - scheduled. Tasks never
    scheduled in the trace (no run time to replay) are skipped."""
    jobs = []
    for t in tasks:
        if t.creation is None or t.deletion is None or t.scheduled is None:
            continue
        duration = max(1.0, t.deletion - t.scheduled)
        req = t.request(t.name, t.creation, synthetic_team(t.name, seed))
        jobs.append(SimJob(req, duration))
    return jobs


def read_generic(path: str | Path, seed: int = 0) -> list[SimJob]:
    """Generic CSV: ``submit_time,duration,gpus,gpu_model,team,priority`` and optionally ``job_id, gpu_milli,
    cpu_milli, memory_mib, mig_profile, gang_nodes, gpus_per_node, priority_class, preemptible, max_runtime_s,
    project, kind, replica_group``. `gpu_model` may list models separated by ``|``; an empty team gets a synthetic one."""
    jobs = []
    with open(path, newline="") as f:
        for i, row in enumerate(csv.DictReader(f)):
            job_id = _first(row, "job_id", default=f"job-{i:06d}")
            gpus = int(float(_first(row, "gpus", default="1")))
            milli = int(float(_first(row, "gpu_milli", default="1000")))
            pre = _first(row, "preemptible")
            req = JobRequest(
                job_id=job_id,
                team=_first(row, "team") or synthetic_team(job_id, seed),
                gpus=gpus,
                submitted_at=float(_first(row, "submit_time", default="0")),
                project=_first(row, "project", default="default"),
                gpu_models=tuple(m for m in _first(row, "gpu_model").split("|") if m),
                priority=int(float(_first(row, "priority", default="0"))),
                priority_class=_first(row, "priority_class"),
                preemptible=None if pre == "" else pre.lower() in ("1", "true", "yes"),
                kind=_first(row, "kind", default="batch"),
                replica_group=_first(row, "replica_group"),
                gang_nodes=int(float(_first(row, "gang_nodes", default="0"))),
                gpus_per_node=int(float(_first(row, "gpus_per_node", default="0"))),
                gpu_fraction_milli=milli if gpus == 1 and 0 < milli < WHOLE else 0,
                mig_profile=_first(row, "mig_profile"),
                cpu_milli=int(float(_first(row, "cpu_milli", default="0"))),
                memory_mib=int(float(_first(row, "memory_mib", default="0"))),
                max_runtime_s=_opt(row.get("max_runtime_s")),
            )
            jobs.append(SimJob(req, float(_first(row, "duration", default="0"))))
    return jobs


# --- the platform's own history (`gpupool history export`) -----------------------------------------------------------
# The generic format's columns, then what only a recorded history has: when each job really started and ended, its
# wait, the GPU model it ran on, and its final state. `read_generic` reads such a file as any generic trace (it
# ignores the extra columns); `read_history` also returns the model each job ran on.
HISTORY_COLUMNS = ("job_id", "submit_time", "duration", "gpus", "gpu_model", "team", "priority", "priority_class",
                   "kind", "project", "gpu_milli", "mig_profile", "gang_nodes", "gpus_per_node", "max_runtime_s",
                   "replica_group", "start_time", "end_time", "wait_s", "gpu_model_granted", "state")


def write_history(path: str | Path, rows: list[dict]) -> int:
    """Write recorded jobs (dicts keyed by HISTORY_COLUMNS; missing keys are empty) as a generic trace CSV, sorted
    by submit time then job id. Returns the number of rows."""
    ordered = sorted(rows, key=lambda r: (float(r["submit_time"]), str(r["job_id"])))
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=HISTORY_COLUMNS, extrasaction="ignore", lineterminator="\n")
        writer.writeheader()
        for r in ordered:
            writer.writerow({c: "" if r.get(c) is None else r[c] for c in HISTORY_COLUMNS})
    return len(ordered)


def read_history(path: str | Path) -> tuple[list[SimJob], dict[str, str]]:
    """A history trace: its jobs (as `read_generic` reads them) and, per job id, the GPU model it ran on
    (`gpu_model_granted`; else the one model it asked for; else empty)."""
    jobs = read_generic(path)
    served: dict[str, str] = {}
    with open(path, newline="") as f:
        for i, row in enumerate(csv.DictReader(f)):
            job_id = _first(row, "job_id", default=f"job-{i:06d}")
            asked = [m for m in _first(row, "gpu_model").split("|") if m]
            served[job_id] = _first(row, "gpu_model_granted") or (asked[0] if len(asked) == 1 else "")
    return jobs, served
