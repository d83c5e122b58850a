"""The gateway app without servers: NATS request/reply answered by a fake bus (queue, placement, node agents), tokens
by a fake authenticator. Routes run for real (validation, scoping, problem bodies, streaming)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

from libs.bus.rpc import ServiceUnavailable
from libs.contracts import subjects
from libs.contracts.commands import Command, ReadLogs, Reply, SubmitJob
from services.gateway import handlers, logs
from services.gateway.bootstrap import create_app
from services.gateway.config import GatewaySettings
from services.gateway.domain import Principal

NOW = "2026-01-01T12:00:00+00:00"
PRINCIPALS = {
    "admin": Principal("admin", "platform-admin", None, "bootstrap"),
    "alice": Principal("alice", "member", "research", "token", "t1"),
    "bob": Principal("bob", "member", "other", "token", "t2"),
}
WORK = {"command": ["sh", "-c", "echo hi"], "env": {}, "workdir": None, "limits": {}, "stop_signal": "SIGTERM",
        "stop_grace_s": 30.0, "warn_before_s": None, "warn_signal": "SIGUSR1",
        "restart": {"policy": "never", "attempts": 0, "delay_s": 10.0}, "isolation": "process", "image": None,
        "rootfs": None}


def job_view(job_id: str = "j1", **over: Any) -> dict[str, Any]:
    doc = {"job_id": job_id, "name": "demo", "team": "research", "project": "default", "kind": "batch",
           "priority_class": "normal", "gpus": 1, "gpu_models": [], "state": "running", "submitted_at": NOW,
           "replicas": 1, "gang_nodes": 0, "gpus_per_node": 0, "work": WORK, "exit_code": None, "reason": None}
    doc.update(over)
    return doc


def allocation(allocation_id: str, *, replica: int = 0, attempt: int | None = None, node: str = "n0",
               granted_at: str = NOW, released: bool = False) -> dict[str, Any]:
    doc = {"allocation_id": allocation_id, "job_id": "j1", "replica": replica, "cluster": "c1", "node": node,
           "granted_at": granted_at, "released_at": NOW if released else None}
    if attempt is not None:
        doc["attempt"] = attempt
    return doc


@dataclass
class Output:
    """What one stream of one allocation has written so far (ASCII: characters are bytes)."""

    text: str = ""
    complete: bool = False


@dataclass
class FakeBus:
    jobs: dict[str, dict[str, Any]] = field(default_factory=dict)
    allocations: list[dict[str, Any]] = field(default_factory=list)
    outputs: dict[tuple[str, str], Output] = field(default_factory=dict)
    silent_nodes: set[str] = field(default_factory=set)
    not_started: set[str] = field(default_factory=set)  # allocations their agent does not know (yet): 404 NoLogs
    sent: list[tuple[str, Command]] = field(default_factory=list)
    # called before each answer, with the subject and how many requests came before: scripts a job's progress
    on_request: Callable[[str, int], None] | None = None

    def write(self, allocation_id: str, stream: str, text: str, *, complete: bool = False) -> None:
        out = self.outputs.setdefault((allocation_id, stream), Output())
        out.text += text
        out.complete = out.complete or complete

    def finish(self, allocation_id: str) -> None:
        for stream in ("stdout", "stderr"):
            self.outputs.setdefault((allocation_id, stream), Output()).complete = True

    def submitted(self) -> list[SubmitJob]:
        return [cmd for subject, cmd in self.sent if subject == subjects.CMD_QUEUE_SUBMIT_JOB]  # type: ignore[misc]

    def reads(self) -> list[ReadLogs]:
        return [cmd for _, cmd in self.sent if isinstance(cmd, ReadLogs)]

    async def request(self, nc: Any, subject: str, cmd: Command, *, timeout: float = 5.0) -> Reply:
        if self.on_request is not None:
            self.on_request(subject, len(self.sent))
        self.sent.append((subject, cmd))
        if subject == subjects.CMD_QUEUE_SUBMIT_JOB:
            assert isinstance(cmd, SubmitJob)
            return Reply.success({**job_view("j9", name=cmd.name, team=cmd.team, state="pending"), "created": True})
        if subject == subjects.QUERY_QUEUE_GET_JOB:
            job = self.jobs.get(cmd.job_id)  # type: ignore[attr-defined]
            if job is None:
                return Reply.failure(404, "JobNotFound", f"no job {cmd.job_id}")  # type: ignore[attr-defined]
            return Reply.success(dict(job))
        if subject == subjects.QUERY_PLACEMENT_LIST_ALLOCATIONS:
            items = [a for a in self.allocations if a["job_id"] == cmd.job_id]  # type: ignore[attr-defined]
            return Reply.success({"items": items, "next": None})
        if subject.startswith("gpupool.query.agent."):
            return self._read_logs(subject, cmd)
        raise AssertionError(f"unexpected request on {subject}")

    def _read_logs(self, subject: str, cmd: Command) -> Reply:
        assert isinstance(cmd, ReadLogs)
        alloc = next((a for a in self.allocations if a["allocation_id"] == cmd.allocation_id), None)
        if alloc is None or subject != subjects.agent_logs(alloc["cluster"], alloc["node"]):
            return Reply.failure(404, "AllocationNotFound", f"no allocation {cmd.allocation_id} on this node")
        if alloc["node"] in self.silent_nodes:
            raise ServiceUnavailable(f"no reply on {subject}")
        if cmd.allocation_id in self.not_started:
            return Reply.failure(404, "NoLogs", f"no work of allocation {cmd.allocation_id} on {alloc['node']}")
        out = self.outputs.get((cmd.allocation_id, cmd.stream), Output())
        start = max(0, len(out.text) - cmd.tail) if cmd.tail is not None else min(cmd.offset, len(out.text))
        data = out.text[start:start + cmd.limit]
        end = start + len(data)
        return Reply.success({"allocation_id": cmd.allocation_id, "stream": cmd.stream, "offset": start,
                              "next_offset": end, "data": data, "complete": out.complete and end == len(out.text)})


class FakeAuthenticator:
    async def authenticate(self, token: str) -> Principal:
        from services.gateway.auth import AuthError

        if token not in PRINCIPALS:
            raise AuthError("InvalidToken", "unknown token")
        return PRINCIPALS[token]

    def forget(self, token_id: str) -> None:
        pass


@pytest.fixture
def bus(monkeypatch: pytest.MonkeyPatch) -> FakeBus:
    fake = FakeBus()
    monkeypatch.setattr(handlers, "request", fake.request)
    monkeypatch.setattr(logs, "request", fake.request)
    monkeypatch.setattr(logs, "POLL_S", 0.0)
    return fake


@pytest.fixture
def app(bus: FakeBus) -> Any:
    gateway = create_app(GatewaySettings(environment="dev"))
    gateway.state.nc = None
    gateway.state.authenticator = FakeAuthenticator()
    return gateway


def client(app: Any, token: str = "admin") -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gateway",
                             headers={"Authorization": f"Bearer {token}"})
