"""What the agent asks the executor to run (LaunchSpec), what it gets back when the work has ended (ExitReport) and
how a launch fails (LaunchError). Plain dataclasses, JSON-serialisable both ways (`to_dict` / `from_dict`), no
project imports: the shim reads the same JSON."""

from __future__ import annotations

import re
import signal as _signal
from dataclasses import asdict, dataclass, field, fields
from datetime import UTC, datetime
from typing import Any, Literal

Isolation = Literal["process", "sandbox", "container"]
ISOLATIONS: tuple[str, ...] = ("process", "sandbox", "container")
NOBODY = 65534
DEFAULT_LOG_MAX_BYTES = 16 * 1024 * 1024

# Allocation and job ids become directory and cgroup names: keep them to a safe alphabet.
_SAFE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")

LAUNCH_REASONS = ("CommandNotFound", "WorkdirUnavailable", "SandboxFailed", "ImagePullFailed",
                  "DriverUnavailable", "CgroupFailed", "LaunchFailed")


class LaunchError(Exception):
    """The work could not be started; nothing of it is left running. `reason` is a CamelCase machine code (one
    of LAUNCH_REASONS), `message` says what happened in words."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(f"{reason}: {message}")
        self.reason = reason
        self.message = message


@dataclass(frozen=True, slots=True)
class Limits:
    cpu_milli: int | None = None  # CPU bandwidth in thousandths of a core (1500 = 1.5 cores)
    memory_mib: int | None = None  # RAM (and swap: none) for the whole cgroup; the OOM killer acts above it
    pids: int | None = None  # tasks (processes and threads) at once


@dataclass(frozen=True)
class LaunchSpec:
    allocation_id: str
    job_id: str
    argv: list[str]
    attempt: int = 1
    restart: int = 0  # restarts of this attempt on the same allocation (a service replica that failed its health)
    replica: int = 0
    env: dict[str, str] = field(default_factory=dict)  # the final environment; the executor adds GPUPOOL_* only
    workdir: str | None = None  # None: <state_dir>/jobs/<job_id>/work, made and owned by uid
    limits: Limits = field(default_factory=Limits)
    gpu_indices: list[int] = field(default_factory=list)  # whole GPUs granted: /dev/nvidia<i>
    device_dir: str = "/dev"  # where the nvidia device nodes live (tests point it at mknod'd fakes)
    isolation: str = "process"
    image: str | None = None  # container: an image the node already has (never pulled)
    rootfs: str | None = None  # container: an exploded root filesystem instead of an image
    stop_signal: str = "SIGTERM"
    stop_grace_s: float = 30.0
    max_runtime_s: float | None = None
    warn_before_s: float | None = None
    warn_signal: str = "SIGUSR1"
    uid: int | None = None  # None: the executor's default_uid (65534, nobody)
    gid: int | None = None  # None: the executor's default_gid (65534, nogroup)
    log_max_bytes: int = DEFAULT_LOG_MAX_BYTES  # per stream and file: stdout.log + stdout.log.1

    def to_dict(self) -> dict[str, Any]:
        """Plain data (JSON-able), built field by field: `asdict`'s deep copy was most of a launch's CPU."""
        out = {f: getattr(self, f) for f in _SPEC_FIELDS}
        out["argv"], out["env"], out["gpu_indices"] = list(self.argv), dict(self.env), list(self.gpu_indices)
        out["limits"] = {"cpu_milli": self.limits.cpu_milli, "memory_mib": self.limits.memory_mib,
                         "pids": self.limits.pids}
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LaunchSpec:
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        values["limits"] = Limits(**(values.get("limits") or {}))
        values["argv"] = list(values.get("argv") or [])
        values["gpu_indices"] = [int(i) for i in values.get("gpu_indices") or []]
        values["env"] = {str(k): str(v) for k, v in (values.get("env") or {}).items()}
        return cls(**values)

    def problems(self) -> list[str]:
        """What makes this spec unlaunchable, in words (empty: fine). Isolation is checked by the executor."""
        out = []
        for name in ("allocation_id", "job_id"):
            if not _SAFE_ID.match(getattr(self, name)):
                out.append(f"{name} {getattr(self, name)!r} must match {_SAFE_ID.pattern}")
        if not self.argv or not isinstance(self.argv[0], str) or not self.argv[0]:
            out.append("argv must name a command")
        if any("\0" in a for a in self.argv) or any("\0" in k + v or "=" in k or not k for k, v in self.env.items()):
            out.append("argv and env must not contain NUL, env names no '=' and not be empty")
        for name in ("stop_signal", "warn_signal"):
            if signal_number(getattr(self, name)) is None:
                out.append(f"{name} {getattr(self, name)!r} is not a signal name")
        if self.stop_grace_s < 0 or (self.max_runtime_s is not None and self.max_runtime_s <= 0):
            out.append("stop_grace_s must be >= 0 and max_runtime_s > 0")
        if self.warn_before_s is not None and self.warn_before_s < 0:
            out.append("warn_before_s must be >= 0")
        if self.log_max_bytes < 1024:
            out.append("log_max_bytes must be at least 1024")
        if any(i < 0 for i in self.gpu_indices):
            out.append("gpu_indices must be >= 0")
        lim = self.limits
        if any(v is not None and v <= 0 for v in (lim.cpu_milli, lim.memory_mib, lim.pids)):
            out.append("limits must be positive")
        return out


_SPEC_FIELDS = tuple(f.name for f in fields(LaunchSpec))


@dataclass(frozen=True)
class ExitReport:
    allocation_id: str
    job_id: str
    attempt: int
    replica: int
    exit_code: int | None  # None: killed by a signal, or lost
    signal: str | None  # e.g. "SIGKILL"
    oom: bool  # the memory controller OOM-killed a process of the cgroup
    reason: str  # Completed / NonZeroExit / OutOfMemory / Signalled / MaxRuntimeExceeded / Stopped / Lost
    message: str
    started_at: datetime
    exited_at: datetime
    wall_s: float
    cpu_s: float  # user + system of the whole cgroup (or process tree without cgroups)
    stopped: bool  # ended after a stop request
    pid: int | None

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["started_at"] = self.started_at.isoformat()
        out["exited_at"] = self.exited_at.isoformat()
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ExitReport:
        values = dict(data)
        values["started_at"] = datetime.fromisoformat(values["started_at"])
        values["exited_at"] = datetime.fromisoformat(values["exited_at"])
        return cls(**values)


def signal_number(name: str | None) -> int | None:
    """'SIGTERM' (or 'TERM', any case) → 15; None for anything else."""
    if not name or not isinstance(name, str):
        return None
    upper = name.upper()
    upper = upper if upper.startswith("SIG") else "SIG" + upper
    member = getattr(_signal.Signals, upper, None) if not upper.startswith("SIG_") else None
    return int(member) if member is not None else None


def signal_name(number: int | None) -> str | None:
    if number is None:
        return None
    try:
        return _signal.Signals(number).name
    except ValueError:
        return f"SIG{number}"


def utc(at: float) -> datetime:
    return datetime.fromtimestamp(at, UTC)
