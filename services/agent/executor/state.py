"""The executor's memory across agent restarts: one record per attempt, `<attempt_dir>/record.jsonl`, with its
dirs, shim pid, work pid, cgroup, deadlines and whether its exit was reported. Each change appends the attempt's
whole state as one line to its own record, and the last whole line is the attempt: a node with many attempts pays
for the one that changed, and an append costs a tenth of a rewrite (temp file + rename on ext4 forces the new
file's blocks out: ~1 ms each, several per launch). A line cut short by a crash is ignored.

Before records, the executor kept every attempt in one file, `<state_dir>/executor.json`; `load` takes such a file
over once (its attempts become records, the file goes)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field, fields
from typing import Any

from services.agent.executor.spec import LaunchSpec

STATE_VERSION = 1
RECORD = "record.jsonl"
LEGACY_FILE = "executor.json"


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
        out = {name: getattr(self, name) for name in _FIELDS}
        out["spec"] = self.spec.to_dict()
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Attempt:
        values = {k: v for k, v in data.items() if k in _FIELDS}
        values["spec"] = LaunchSpec.from_dict(values["spec"])
        return cls(**values)


_FIELDS = frozenset(f.name for f in fields(Attempt))


def record_path(attempt_dir: str) -> str:
    return os.path.join(attempt_dir, RECORD)


def load(state_dir: str) -> tuple[dict[str, Attempt], list[str]]:
    """The attempts recorded under state_dir (allocation id → attempt), and the attempt dirs that have no record
    (a launch interrupted before it was recorded: nothing of it ran, its cgroup is a stray)."""
    _take_over_legacy(state_dir)
    attempts: dict[str, Attempt] = {}
    unrecorded: list[str] = []
    root = os.path.join(state_dir, "attempts")
    for name in sorted(os.listdir(root)) if os.path.isdir(root) else ():
        attempt_dir = os.path.join(root, name)
        if not os.path.isdir(attempt_dir):
            continue
        data = _last_line(record_path(attempt_dir))
        if data is None:
            unrecorded.append(attempt_dir)
            continue
        if data.get("version") != STATE_VERSION:
            raise ValueError(f"{record_path(attempt_dir)}: unknown state version {data.get('version')!r}")
        rec = Attempt.from_dict(data["attempt"])
        attempts[rec.spec.allocation_id] = rec
    return attempts, unrecorded


def save(rec: Attempt) -> None:
    """Append the attempt's state to its record (its attempt dir exists from the launch on). One write(2) of one
    line with O_APPEND: a crash leaves at most the last line short."""
    line = json.dumps({"version": STATE_VERSION, "attempt": rec.to_dict()}, separators=(",", ":")) + "\n"
    fd = os.open(record_path(rec.attempt_dir), os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o640)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def _last_line(path: str) -> dict[str, Any] | None:
    """The last whole line of a record; None when there is no record (or not one whole line)."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return None
    lines = data.split(b"\n")
    if lines[-1]:  # a line cut short by a crash: cut it off, or the next append would join it
        os.truncate(path, len(data) - len(lines[-1]))
    for raw in reversed(lines[:-1]):
        if raw.strip():
            try:
                return json.loads(raw)
            except ValueError:  # cut short by a crash: the line before is the attempt
                continue
    return None


def _take_over_legacy(state_dir: str) -> None:
    path = os.path.join(state_dir, LEGACY_FILE)
    try:
        with open(path, "rb") as f:
            data = json.loads(f.read())
    except FileNotFoundError:
        return
    if data.get("version") != STATE_VERSION:
        raise ValueError(f"{path}: unknown state version {data.get('version')!r}")
    for raw in data.get("attempts", []):
        rec = Attempt.from_dict(raw)
        if rec.state == "ended" and rec.reported and not os.path.isdir(rec.attempt_dir):
            continue  # nothing of it is left to adopt, report or read
        os.makedirs(rec.attempt_dir, exist_ok=True)
        save(rec)
    os.remove(path)


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
