"""The executor's memory across agent restarts: `<state_dir>/executor.json`, every attempt with its dirs, shim pid,
work pid, cgroup, deadlines and whether its exit was reported. Written whole, atomically (temp file + rename)."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from services.agent.executor.logs import _atomic_write
from services.agent.executor.spec import LaunchSpec

STATE_VERSION = 1


@dataclass
class Attempt:
    spec: LaunchSpec  # as launched: uid and gid filled in
    attempt_dir: str
    workdir: str
    workdir_made: bool  # the executor made it (<state_dir>/jobs/<job_id>/work): prune may delete it
    checkpoint_dir: str
    control_dir: str
    deadline_file: str
    cgroup: dict[str, Any]  # cgroups.JobCgroup.descriptor()
    launchers: list[str]
    container_name: str
    launched_at: float
    state: str = "starting"  # starting → running → ended
    shim_pid: int | None = None
    shim_start: int | None = None  # the shim's start time in clock ticks (/proc/<pid>/stat): pid reuse check
    pid: int | None = None
    started_at: float | None = None
    runtime_deadline: float | None = None
    warn_at: float | None = None
    warned: bool = False
    runtime_stopped: bool = False
    stop_deadline: float | None = None
    stop_reason: str | None = None
    stop_signals: list[str] = field(default_factory=list)
    killed_at: float | None = None
    report: dict[str, Any] | None = None  # the ExitReport, once built (re-sent as is after a restart)
    reported: bool = False
    ended_at: float | None = None

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["spec"] = self.spec.to_dict()
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Attempt:
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        values["spec"] = LaunchSpec.from_dict(values["spec"])
        return cls(**values)


def load(path: str) -> dict[str, Attempt]:
    try:
        with open(path, "rb") as f:
            data = json.loads(f.read())
    except FileNotFoundError:
        return {}
    if data.get("version") != STATE_VERSION:
        raise ValueError(f"{path}: unknown state version {data.get('version')!r}")
    return {a["spec"]["allocation_id"]: Attempt.from_dict(a) for a in data.get("attempts", [])}


def save(path: str, attempts: dict[str, Attempt], cgroup_name: str) -> None:
    doc = {"version": STATE_VERSION, "cgroup_name": cgroup_name,
           "attempts": [a.to_dict() for a in attempts.values()]}
    os.makedirs(os.path.dirname(path), exist_ok=True)
    _atomic_write(path, json.dumps(doc, indent=1).encode())


def proc_start_time(pid: int) -> int | None:
    """Start time in clock ticks since boot, None if the process is gone or a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            raw = f.read()
    except OSError:
        return None
    rest = raw[raw.rfind(")") + 2:].split()
    if not rest or rest[0] in ("Z", "X"):
        return None
    return int(rest[19])
