"""What a job runs: the work spec the node's agent launches on the granted GPUs, and how an attempt of it ended.

A job without `command` holds GPUs for a caller who launches its own work (as before the executor existed); a job
with one is run by the agent of every node it is granted on: one process tree per allocation (a gang member or a
replica), in its own cgroup, with the limits, devices and environment of its grant.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Annotated, Literal

from pydantic import ConfigDict, Field, field_validator, model_validator

from libs.contracts.bounds import BoundedModel

# Signals a job may ask to be stopped or warned with (names, not numbers: numbers differ between platforms).
StopSignal = Literal["SIGTERM", "SIGINT", "SIGQUIT", "SIGHUP", "SIGUSR1", "SIGUSR2", "SIGKILL"]
Isolation = Literal["process", "sandbox", "container"]
ISOLATIONS: tuple[str, ...] = ("process", "sandbox", "container")
# The node label an agent registers for each driver it can run (`<prefix><driver>=true`); placement requires it of a
# node for a job whose work uses that driver.
ISOLATION_LABEL_PREFIX = "gpupool.io/isolation."

ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
# The agent sets these from the grant; a job's env cannot override what keeps it inside its allocation.
RESERVED_ENV_PREFIXES = ("GPUPOOL_", "CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "CUDA_MPS_")
MAX_ARG_CHARS = 32_768
MAX_ENV_VALUE_CHARS = 32_768

Arg = Annotated[str, Field(max_length=MAX_ARG_CHARS)]


class WorkLimits(BoundedModel):
    """Enforced on the node by the work's cgroup. None: no limit beyond the node's."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    cpu_milli: int | None = Field(default=None, ge=10, le=1_024_000,
                                  description="CPU time as milli-cores (1000 = one core), CFS quota")
    memory_mib: int | None = Field(default=None, ge=4, le=16_777_216,
                                   description="resident memory; beyond it the memory controller kills "
                                               "(reason OutOfMemory)")
    pids: int | None = Field(default=None, ge=1, le=4_194_304,
                             description="processes and threads at once; beyond it fork/clone fails (EAGAIN)")


class RestartPolicy(BoundedModel):
    """What happens when an attempt fails (non-zero exit, signal, out of memory, launch failure)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    policy: Literal["never", "on_failure"] = "never"
    attempts: int = Field(default=0, ge=0, le=100, description="restarts after failures (with on_failure)")
    delay_s: float = Field(default=10.0, ge=0, le=3600, description="wait before each restart")

    @model_validator(mode="after")
    def _attempts_need_policy(self) -> RestartPolicy:
        if self.policy == "on_failure" and self.attempts < 1:
            raise ValueError("restart on_failure needs attempts >= 1")
        if self.policy == "never" and self.attempts:
            raise ValueError("restart attempts need policy on_failure")
        return self


PORT_NAME = r"^[a-z][a-z0-9-]{0,14}$"
PortName = Annotated[str, Field(pattern=PORT_NAME)]


class HealthCheck(BoundedModel):
    """How the agent tells whether a replica serves: exactly one of `http` (GET this path on the first port, or on
    `port`; a 2xx or 3xx answer is healthy), `tcp` (a port name: healthy when it accepts a connection) or `exec` (an
    argv run on the node as the work's user with its environment: exit 0 is healthy). A replica is ready after its
    first healthy probe; `failures` unhealthy probes in a row (not counted during `grace_s` after a start, until
    it was ready once) make it unready and restart it on the same allocation."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    http: str | None = Field(default=None, max_length=1024, pattern=r"^/[!-~]*$",
                             description="path to GET, e.g. /healthz")
    tcp: PortName | None = Field(default=None, description="a port name (from `ports`)")
    exec: list[Arg] | None = Field(default=None, min_length=1, max_length=64, description="argv; exit 0 is healthy")
    port: PortName | None = Field(default=None, description="with http: which port (default the first)")
    interval_s: float = Field(default=5.0, ge=0.1, le=3600, description="between probes")
    timeout_s: float = Field(default=2.0, ge=0.05, le=600, description="a probe not answered within this fails")
    grace_s: float = Field(default=30.0, ge=0, le=3600, description="after a start: time to come up")
    failures: int = Field(default=3, ge=1, le=100, description="unhealthy probes in a row before a restart")

    @model_validator(mode="after")
    def _one_kind(self) -> HealthCheck:
        if sum(x is not None for x in (self.http, self.tcp, self.exec)) != 1:
            raise ValueError("a health check is exactly one of http, tcp or exec")
        if self.port is not None and self.http is None:
            raise ValueError("health port goes with http")
        if self.timeout_s > self.interval_s:
            raise ValueError("health timeout_s must not exceed interval_s")
        return self


METRIC_NAME = r"^[a-zA-Z_:][a-zA-Z0-9_:]{0,199}$"  # a Prometheus metric name


class LoadProbe(BoundedModel):
    """What the agent samples from each replica for its job's autoscaler, every `every_s`: its GPUs' mean
    utilisation (percent, from the node's telemetry) or one Prometheus metric scraped from the replica (`GET
    http://<node>:<port>/<path>`, the sum of every series of `metric`). Set by the platform from the job's
    `autoscale` policy (signal `gpu_utilization` or `metric`), not submitted."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    signal: Literal["gpu_utilization", "metric"]
    every_s: float = Field(ge=0.5, le=600)
    metric: str | None = Field(default=None, pattern=METRIC_NAME)
    port: PortName | None = Field(default=None, description="metric: the port it is served on")
    path: str = Field(default="/metrics", max_length=256, pattern=r"^/[A-Za-z0-9._~/%-]*$")

    @model_validator(mode="after")
    def _metric_named(self) -> LoadProbe:
        if (self.signal == "metric") != (self.metric is not None and self.port is not None):
            raise ValueError("a metric probe names its metric and port, and only a metric probe does")
        return self


class WorkSpec(BoundedModel):
    """The work a job runs. Travels from the submission through `job.submitted` and `allocation.granted` to the
    agent of each granted node."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    command: list[Arg] = Field(min_length=1, max_length=4096,
                               description="argv; no shell unless you write [\"sh\", \"-c\", ...]")
    env: dict[str, Annotated[str, Field(max_length=MAX_ENV_VALUE_CHARS)]] = Field(
        default_factory=dict, max_length=512,
        description="merged over what the grant sets; GPUPOOL_*, CUDA_VISIBLE_DEVICES and CUDA_MPS_* are the "
                    "grant's and cannot be set")
    workdir: str | None = Field(default=None, max_length=4096,
                                description="absolute path on the node; default a fresh directory per job")
    limits: WorkLimits = Field(default_factory=WorkLimits)
    stop_signal: StopSignal = "SIGTERM"
    stop_grace_s: float = Field(default=30.0, ge=0, le=3600,
                                description="between the stop signal and the kill (clamped by the agent's maximum)")
    warn_before_s: float | None = Field(default=None, gt=0, le=86_400,
                                        description="with max_runtime_s: send warn_signal this long before it")
    warn_signal: StopSignal = "SIGUSR1"
    restart: RestartPolicy = Field(default_factory=RestartPolicy)
    isolation: Isolation = "process"
    image: str | None = Field(default=None, max_length=512, pattern=r"^[A-Za-z0-9][A-Za-z0-9._/:@+-]*$",
                              description="container: an image the node already has (never pulled)")
    rootfs: str | None = Field(default=None, max_length=4096,
                               description="container: a root filesystem directory on the node")
    ports: list[PortName] = Field(default_factory=list, max_length=16,
                                  description="named ports the work serves on: the agent picks a free host port "
                                              "for each and passes PORT (the first) and PORT_<NAME>")
    health: HealthCheck | None = Field(default=None, description="how the agent tells the replica serves")
    load: LoadProbe | None = Field(default=None, description="set from the job's autoscale policy: what the agent "
                                   "samples from each replica for it")

    @field_validator("command")
    @classmethod
    def _program_named(cls, argv: list[str]) -> list[str]:
        if not argv[0].strip():
            raise ValueError("command[0] names the program and cannot be empty")
        if any("\x00" in a for a in argv):
            raise ValueError("command must not contain NUL characters")
        return argv

    @field_validator("env")
    @classmethod
    def _env_names(cls, env: dict[str, str]) -> dict[str, str]:
        for name, value in env.items():
            if not ENV_NAME.match(name):
                raise ValueError(f"env name {name[:64]!r} is not [A-Za-z_][A-Za-z0-9_]*")
            if name.startswith(RESERVED_ENV_PREFIXES):
                raise ValueError(f"env {name} is set by the grant and cannot be overridden")
            if "\x00" in value:
                raise ValueError(f"env {name} must not contain NUL characters")
        return env

    @field_validator("workdir", "rootfs")
    @classmethod
    def _absolute(cls, path: str | None) -> str | None:
        if path is None:
            return None
        if not path.startswith("/") or "\x00" in path or "/../" in f"{path}/":
            raise ValueError("must be an absolute path without '..'")
        return path

    @model_validator(mode="after")
    def _ports_named_once(self) -> WorkSpec:
        if len(set(self.ports)) != len(self.ports):
            raise ValueError("ports must be named once each")
        h = self.health
        if h is not None:
            if h.http is not None and not self.ports:
                raise ValueError("an http health check needs a port (ports)")
            for name in (h.tcp, h.port):
                if name is not None and name not in self.ports:
                    raise ValueError(f"health names port {name!r}, which is not in ports")
        if self.load is not None and self.load.port is not None and self.load.port not in self.ports:
            raise ValueError(f"the load metric's port {self.load.port!r} is not in ports")
        return self

    @model_validator(mode="after")
    def _container_needs_root(self) -> WorkSpec:
        if self.isolation == "container":
            if bool(self.image) == bool(self.rootfs):
                raise ValueError("isolation container needs exactly one of image or rootfs")
        elif self.image or self.rootfs:
            raise ValueError("image and rootfs go with isolation container")
        return self


# Why an attempt ended, as the agent reports it (the executor's classification) and the job then shows it.
ExitReason = Literal[
    "Completed", "NonZeroExit", "OutOfMemory", "Signalled", "MaxRuntimeExceeded", "Stopped", "Lost",
    "FractionMemoryExceeded", "CommandNotFound", "WorkdirUnavailable", "SandboxFailed", "ImagePullFailed", "DriverUnavailable",
    "CgroupFailed", "LaunchFailed"]
LAUNCH_FAILURES = frozenset({"CommandNotFound", "WorkdirUnavailable", "SandboxFailed", "ImagePullFailed",
                             "DriverUnavailable", "CgroupFailed", "LaunchFailed"})


class WorkExit(BoundedModel):
    """How one attempt's work ended on one allocation; carried by `agent.work_exited` and by the release it
    causes."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    reason: ExitReason
    exit_code: int | None = Field(default=None, ge=-255, le=255)
    signal: str | None = Field(default=None, max_length=16, pattern=r"^SIG[A-Z0-9+-]{1,12}$")
    oom: bool = False
    stopped: bool = Field(default=False, description="ended after a stop request (preemption, cancel, reclaim)")
    message: str = Field(default="", max_length=2000)
    started_at: datetime | None = None
    exited_at: datetime
    wall_s: float = Field(default=0.0, ge=0, le=1e9)
    cpu_s: float = Field(default=0.0, ge=0, le=1e12)

    @property
    def succeeded(self) -> bool:
        return self.reason == "Completed"
