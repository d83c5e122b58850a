"""Jobs that run a command, and their logs, in the typed client. Mixed into `GpupoolClient`:

    with GpupoolClient.from_env() as gp:
        job = gp.submit("hello", "research", 1, command=["sh", "-c", "nvidia-smi -L"],
                        env={"EPOCHS": "3"}, limits={"memory_mib": 8192},
                        restart={"policy": "on_failure", "attempts": 2})
        for text in gp.follow_logs(job.job_id):    # until the job has ended
            print(text, end="")
        print(gp.get_job(job.job_id).exit_code)
        print(gp.logs(job.job_id, stream="stderr", tail=20))
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Literal, TypedDict, Unpack

import httpx

from libs.client.errors import GpupoolError, _seg, error_from_response
from libs.client.models import SubmitResult

LogStream = Literal["stdout", "stderr", "both"]
CONNECT_TIMEOUT_S = 10.0


class ShapeFields(TypedDict, total=False):
    """How a job holds GPUs and where it is queued (the keyword arguments of `submit_job`)."""

    project: str
    gpu_models: Sequence[str]
    kind: str
    priority_class: str
    idempotency_key: str
    gang_nodes: int
    gpus_per_node: int
    replicas: int
    max_runtime_s: float
    gpu_fraction_milli: int
    gpu_memory_mib: int
    mig_profile: str
    exclusive: bool


def work_body(*, command: Sequence[str] | None = None, env: Mapping[str, str] | None = None,
              workdir: str | None = None, limits: Mapping[str, int | None] | None = None,
              stop_signal: str | None = None, stop_grace_s: float | None = None,
              warn_before_s: float | None = None, warn_signal: str | None = None,
              restart: Mapping[str, Any] | None = None, isolation: str | None = None, image: str | None = None,
              rootfs: str | None = None) -> dict[str, Any]:
    """The work fields of a `POST /v1/jobs` body: only those given (the gateway's defaults stand for the rest)."""
    body: dict[str, Any] = {}
    if command is not None:
        if isinstance(command, str):
            raise TypeError("command is an argv list, e.g. ['sh', '-c', 'echo hi'], not a string")
        body["command"] = [str(a) for a in command]
    if env:
        body["env"] = dict(env)
    if limits:
        body["limits"] = {k: v for k, v in limits.items() if v is not None}
    if restart:
        body["restart"] = dict(restart)
    for key, value in (("workdir", workdir), ("stop_signal", stop_signal), ("stop_grace_s", stop_grace_s),
                       ("warn_before_s", warn_before_s), ("warn_signal", warn_signal), ("isolation", isolation),
                       ("image", image), ("rootfs", rootfs)):
        if value is not None:
            body[key] = value
    return body


def logs_params(replica: int | None, attempt: int | None, stream: LogStream, tail: int | None,
                follow: bool) -> dict[str, Any]:
    return {"replica": replica, "attempt": attempt, "stream": stream, "tail": tail,
            "follow": "true" if follow else None}


class WorkApi:
    """Calls on a job's work, mixed into GpupoolClient, which provides the plumbing declared here (annotations
    only)."""

    base_url: str
    _http: httpx.Client
    request: Callable[..., Any]
    submit_job: Callable[..., SubmitResult]

    def submit(self, name: str, team: str, gpus: int = 1, *, command: Sequence[str] | None = None,
               env: Mapping[str, str] | None = None, workdir: str | None = None,
               limits: Mapping[str, int | None] | None = None, stop_signal: str | None = None,
               stop_grace_s: float | None = None, warn_before_s: float | None = None,
               warn_signal: str | None = None, restart: Mapping[str, Any] | None = None,
               isolation: str | None = None, image: str | None = None, rootfs: str | None = None,
               **shape: Unpack[ShapeFields]) -> SubmitResult:
        """Submit a job that runs `command` (an argv list; no shell unless you pass ["sh", "-c", ...]) on its
        GPUs: the agent of every granted node launches it with `env` merged over the grant's environment, in
        `workdir`, inside `limits` ({cpu_milli, memory_mib, pids}), stopped with `stop_signal` and killed
        `stop_grace_s` later, warned with `warn_signal` `warn_before_s` before `max_runtime_s`, restarted per
        `restart` ({policy: never|on_failure, attempts, delay_s}), isolated as `isolation` (process, sandbox,
        container with `image` or `rootfs`). The shape and queue fields are those of `submit_job`. Without a
        command the job only holds GPUs (as `submit_job`)."""
        work = work_body(command=command, env=env, workdir=workdir, limits=limits, stop_signal=stop_signal,
                         stop_grace_s=stop_grace_s, warn_before_s=warn_before_s, warn_signal=warn_signal,
                         restart=restart, isolation=isolation, image=image, rootfs=rootfs)
        return self.submit_job(name, team, gpus, work=work, **shape)

    def logs(self, job_id: str, *, replica: int | None = None, attempt: int | None = None,
             stream: LogStream = "both", tail: int | None = None) -> str:
        """What the job's work wrote so far: the latest attempt unless `attempt`, every replica unless `replica`
        (lines then start with "[replica N] " when the job has several), stdout and stderr interleaved by whole
        lines unless `stream`, the last `tail` lines of each. GpupoolError NoLogs (404) for a job without a command
        or one that has not started."""
        resp = self.request("GET", f"/v1/jobs/{_seg(job_id)}/logs",
                            params=logs_params(replica, attempt, stream, tail, False), headers=_TEXT)
        return str(resp.text)

    def follow_logs(self, job_id: str, *, replica: int | None = None, attempt: int | None = None,
                    stream: LogStream = "both", tail: int | None = None) -> Iterator[str]:
        """The job's output as it is written, in text pieces (not lines), until the job has ended and everything
        was read; it waits while the job is pending or launching. Problems before the first piece are
        GpupoolErrors (as `logs`); a connection lost midway is a GpupoolError Unreachable. Not retried: a second
        try would repeat what was already yielded."""
        path = f"/v1/jobs/{_seg(job_id)}/logs"
        params = {k: v for k, v in logs_params(replica, attempt, stream, tail, True).items() if v is not None}
        timeout = httpx.Timeout(CONNECT_TIMEOUT_S, read=None)  # a pending job may say nothing for hours
        try:
            with self._http.stream("GET", path, params=params, headers=_TEXT, timeout=timeout) as resp:
                if not resp.is_success:
                    resp.read()
                    raise error_from_response(resp)
                yield from resp.iter_text()
        except httpx.TransportError as exc:
            raise GpupoolError(0, "Unreachable", f"lost the log stream from {self.base_url} "
                                                 f"({type(exc).__name__})") from None


_TEXT = {"Accept": "text/plain, application/problem+json"}
