"""`GET /v1/jobs/{job_id}/logs`: what a job's work wrote, read from the agents of the nodes it ran on.

The gateway keeps no logs. It resolves the job's allocations through placement, picks the attempt (default the
latest) and the replicas (default all), and asks each allocation's node agent for its output with `ReadLogs`
(request/reply on `subjects.agent_logs(cluster, node)`). With `follow=true` it keeps asking from each stream's
`next_offset` until the attempt's output is complete and the job has finished, the caller goes away, or a day has
passed; while the job still waits for GPUs (pending, launching) a follower waits with it.

Text rules (pure functions below): with several replicas or gang members shown every line carries `[replica N] `;
whenever more than one stream is interleaved (several replicas, or `stream=both`) only whole lines are sent, so a
line is never cut by another stream's; `tail=N` keeps the last N lines of each stream of each replica shown.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Path, Query, Request
from fastapi.responses import PlainTextResponse, Response, StreamingResponse

from libs.bus.rpc import ServiceUnavailable, request
from libs.contracts import subjects
from libs.contracts.commands import ListAllocations, LogChunk, ReadLogs
from services.gateway.domain import Action
from services.gateway.handlers import ERRORS, ApiError, Caller, call, job_team, require

log = logging.getLogger(__name__)

LogStreamParam = Literal["stdout", "stderr", "both"]
TEXT = "text/plain; charset=utf-8"
ACTIVE = frozenset({"launching", "running", "preempting"})
TERMINAL = frozenset({"completed", "cancelled", "failed"})
POLL_S = 0.5  # between reads while following, at most
FIRST_POLL_S = 0.05  # ... and at first, and again after new output: a quick job's stream ends at once
# How a read treats an agent's failure: `plain` answers it as the problem; `first` (a follow's first read, before the
# stream starts) does too, except a 404 (the agent has not started the work yet: waited for); `follow` waits for all.
ReadMode = Literal["plain", "first", "follow"]
FOLLOW_MAX_S = 24 * 3600.0  # a follower is ended after this long
REFRESH_S = 5.0  # between re-reading the job and its allocations while output flows
SETTLED_REFRESH_S = 0.1  # ... and once its output is complete, until the job has ended
READ_BYTES = 1_048_576  # one ReadLogs at most (the contract's limit)
READ_MAX_BYTES = 8 * READ_BYTES  # a plain read of one stream stops here (use tail or follow beyond)
TAIL_BYTES_PER_LINE = 512  # tail=N asks the agent for N × this many bytes, then cuts to N lines
AGENT_GIVE_UP_S = 30.0  # an agent silent this long on a finished or released allocation ends its streams

router = APIRouter(prefix="/v1", responses=ERRORS)


# --- pure pieces ----------------------------------------------------------------------------------------------------
def attempt_of(allocation: dict[str, Any]) -> int:
    """The job attempt an allocation serves (placement's list gains `attempt`; before that every one is 0)."""
    return int(allocation.get("attempt") or 0)


def _granted(allocation: dict[str, Any]) -> datetime:
    text = allocation.get("granted_at")
    try:
        return datetime.fromisoformat(text) if text else datetime.min
    except ValueError:
        return datetime.min


def choose_allocations(allocations: Iterable[dict[str, Any]], *, replica: int | None = None,
                       attempt: int | None = None) -> tuple[int | None, list[dict[str, Any]]]:
    """The attempt shown (`attempt`, else the latest present) and its allocations to read: of `replica` (default
    every one), one per replica (the latest granted where a replica was placed again), in replica order."""
    allocations = list(allocations)
    if attempt is None:
        if not allocations:
            return None, []
        attempt = max(attempt_of(a) for a in allocations)
    per_replica: dict[int, dict[str, Any]] = {}
    for a in allocations:
        number = int(a.get("replica") or 0)
        if attempt_of(a) != attempt or (replica is not None and number != replica):
            continue
        held = per_replica.get(number)
        if held is None or _granted(a) > _granted(held):
            per_replica[number] = a
    return attempt, [per_replica[n] for n in sorted(per_replica)]


def tail_lines(text: str, lines: int, *, whole: bool) -> str:
    """The last `lines` lines of `text`. Unless `whole` (the text starts at the stream's first byte), its first
    line may be cut short by the byte tail and is left out."""
    parts = text.splitlines(keepends=True)
    if not whole and parts and len(parts) <= lines:
        parts = parts[1:]
    return "".join(parts[-lines:]) if lines > 0 else ""


def prefix_lines(text: str, prefix: str) -> str:
    """`prefix` before every line of `text` (a last line without its newline too)."""
    if not prefix:
        return text
    return "".join(prefix + line for line in text.splitlines(keepends=True))


def whole_lines(held: str, data: str, *, final: bool) -> tuple[str, str]:
    """(what to send, what to hold back): every complete line of `held + data`; the unfinished rest is held for
    the next chunk, or sent with a newline added when `final` (the stream ended without one)."""
    text = held + data
    if final:
        return (text if not text or text.endswith("\n") else text + "\n"), ""
    cut = text.rfind("\n") + 1
    return text[:cut], text[cut:]


def replica_prefix(job: dict[str, Any], replica: int | None) -> bool:
    """Whether lines carry `[replica N] `: when more than one replica or gang member may be shown."""
    return replica is None and (int(job.get("replicas") or 1) > 1 or int(job.get("gang_nodes") or 0) > 1)


# --- reading from the agents ----------------------------------------------------------------------------------------
@dataclass
class Target:
    """One stream of one allocation, as far as it has been read."""

    allocation_id: str
    cluster: str
    node: str
    replica: int
    stream: Literal["stdout", "stderr"]
    released: bool = False
    offset: int = 0
    read_once: bool = False
    complete: bool = False
    held: str = ""
    silent_since: float | None = None


async def ask_agent(req: Request, target: Target, cmd: ReadLogs) -> LogChunk:
    """One ReadLogs to the agent of the allocation's node: 503 AgentUnavailable when it does not answer, its own
    error when it refuses."""
    subject = subjects.agent_logs(target.cluster, target.node)
    try:
        reply = await request(req.app.state.nc, subject, cmd, timeout=req.app.state.settings.request_timeout_s)
    except ServiceUnavailable as exc:
        raise ApiError(503, "AgentUnavailable", f"the agent of node {target.cluster}/{target.node} did not answer "
                                                f"for the logs of allocation {target.allocation_id}; retry later",
                       node=target.node, cluster=target.cluster) from exc
    if not reply.ok:
        assert reply.error is not None
        raise ApiError(reply.error.status, reply.error.reason, reply.error.message, **reply.error.detail)
    return LogChunk.model_validate(reply.result)


async def job_allocations(req: Request, job_id: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    after: str | None = None
    while True:
        page = await call(req, subjects.QUERY_PLACEMENT_LIST_ALLOCATIONS,
                          ListAllocations(job_id=job_id, limit=1000, after=after))
        items += page["items"]
        if not (after := page.get("next")):
            return items


class LogReader:
    """The streams of one logs request: which allocations, how far each was read, how its text is shaped."""

    def __init__(self, req: Request, job: dict[str, Any], *, replica: int | None, attempt: int | None,
                 stream: LogStreamParam, tail: int | None) -> None:
        self.req, self.job = req, job
        self.replica, self.attempt, self.tail = replica, attempt, tail
        self.streams: tuple[Literal["stdout", "stderr"], ...] = ("stdout", "stderr") if stream == "both" \
            else (stream,)
        self.prefixed = replica_prefix(job, replica)
        self.shown_attempt: int | None = attempt
        self.targets: list[Target] = []
        self.carry = ""  # the held lines of an attempt's streams left behind for a newer attempt

    @property
    def interleaved(self) -> bool:
        return self.prefixed or len(self.streams) > 1 or len(self.targets) > 1

    @property
    def settled(self) -> bool:
        return all(t.complete for t in self.targets)

    def finished(self) -> bool:
        """Nothing more will come: every stream read to its end and the job over (with a fixed attempt, its
        streams ended is enough: a later attempt is not shown)."""
        if self.targets and self.settled and self.attempt is not None:
            return True
        return self.settled and self.job.get("state") in TERMINAL

    async def refresh(self, job: dict[str, Any] | None = None) -> None:
        """Re-read the job (unless given) and its allocations; start streams of allocations that appeared, and move
        to a newer attempt when no attempt was asked for."""
        self.job = job if job is not None else await job_team(self.req, self.job["job_id"])
        shown, chosen = choose_allocations(await job_allocations(self.req, self.job["job_id"]),
                                           replica=self.replica, attempt=self.attempt)
        if shown != self.shown_attempt:
            self.carry += self.flush()
            self.targets = []
            self.shown_attempt = shown
        known = {(t.allocation_id, t.stream): t for t in self.targets}
        targets = []
        for a in chosen:
            for stream in self.streams:
                t = known.get((a["allocation_id"], stream)) or Target(
                    allocation_id=a["allocation_id"], cluster=a.get("cluster") or "", node=a.get("node") or "",
                    replica=int(a.get("replica") or 0), stream=stream)
                t.released = a.get("released_at") is not None
                targets.append(t)
        self.targets = targets

    async def read(self, *, drain: bool, mode: ReadMode) -> str:
        """One round over every unfinished stream; `drain` reads each to its current end (a plain read)."""
        out, self.carry = [self.carry], ""
        for t in self.targets:
            if t.complete:
                continue
            text = await self._read_target(t, drain=drain, mode=mode)
            out.append(self._shape(t, text))
        return "".join(out)

    async def _read_target(self, t: Target, *, drain: bool, mode: ReadMode) -> str:
        parts: list[str] = []
        read = 0
        while not t.complete:
            chunk = await self._ask(t, mode)
            if chunk is None:
                break
            data = chunk.data
            tailed = not t.read_once and self.tail is not None
            if tailed:
                data = tail_lines(data, self.tail or 0, whole=chunk.offset == 0)
            t.read_once = True
            advanced = chunk.next_offset > t.offset
            t.offset, t.complete = chunk.next_offset, chunk.complete
            parts.append(data)
            read += len(chunk.data)
            if tailed or not drain or not advanced or read >= READ_MAX_BYTES:
                break
        return "".join(parts)

    async def _ask(self, t: Target, mode: ReadMode) -> LogChunk | None:
        if not t.read_once and self.tail is not None:
            cmd = ReadLogs(allocation_id=t.allocation_id, stream=t.stream, limit=READ_BYTES,
                           tail=min(self.tail * TAIL_BYTES_PER_LINE, READ_BYTES))
        else:
            cmd = ReadLogs(allocation_id=t.allocation_id, stream=t.stream, offset=t.offset, limit=READ_BYTES)
        if mode == "plain":
            return await ask_agent(self.req, t, cmd)
        try:
            chunk = await ask_agent(self.req, t, cmd)
        except ApiError as exc:
            if mode == "first" and exc.status != 404:
                raise
            self._missed(t, exc)
            return None
        t.silent_since = None
        return chunk

    def _missed(self, t: Target, exc: ApiError) -> None:
        """While following, an agent that does not answer or does not know the allocation is waited for (its work
        may not have started yet, its node may come back), unless the allocation is over: a released allocation or
        a finished job whose agent stays silent, or that the agent no longer knows, has said all it will."""
        over = t.released or self.job.get("state") in TERMINAL
        now = asyncio.get_running_loop().time()
        if t.silent_since is None:
            t.silent_since = now
        if over and (exc.status == 404 or now - t.silent_since >= AGENT_GIVE_UP_S):
            log.info("logs_stream_given_up", extra={"allocation_id": t.allocation_id, "reason": exc.reason})
            t.complete = True

    def _shape(self, t: Target, text: str) -> str:
        if self.interleaved:
            text, t.held = whole_lines(t.held, text, final=t.complete)
        return prefix_lines(text, f"[replica {t.replica}] ") if self.prefixed else text

    def flush(self) -> str:
        """Whatever unfinished lines are still held (the end of a follow or of a plain read)."""
        out = []
        for t in self.targets:
            if t.held:
                text, t.held = whole_lines(t.held, "", final=True)
                out.append(prefix_lines(text, f"[replica {t.replica}] ") if self.prefixed else text)
        return "".join(out)

    async def follow(self, first: str) -> AsyncIterator[str]:
        """The streaming body: what was read so far, then every new piece until `finished()`, the caller leaves,
        or FOLLOW_MAX_S."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + FOLLOW_MAX_S
        if first:
            yield first
        pause, refreshed = FIRST_POLL_S, loop.time()
        while loop.time() < deadline:
            if await self.req.is_disconnected():
                return
            await asyncio.sleep(pause)
            pause = min(POLL_S, pause * 1.5)  # quiet: ask less often, up to POLL_S
            try:
                # the job and its allocations (two requests to the queue and placement): while it has not started,
                # at most every POLL_S however fast its output is read; once its output is complete, soon after
                # (its end is what the follower waits for); while output flows, every REFRESH_S
                since = loop.time() - refreshed
                if (since >= POLL_S and not self.targets) or (self.settled and since >= SETTLED_REFRESH_S) \
                        or since >= REFRESH_S:
                    refreshed = loop.time()
                    await self.refresh()
                    if self.finished():
                        break
                text = await self.read(drain=False, mode="follow")
            except ServiceUnavailable:
                continue  # the queue or placement did not answer this time: ask again next poll
            except ApiError as exc:
                log.info("logs_follow_ended", extra={"job_id": self.job.get("job_id"), "reason": exc.reason})
                break
            if text:
                pause = FIRST_POLL_S  # output flows: follow it closely
                yield text
        rest = self.flush()
        if rest:
            yield rest


# --- the route ------------------------------------------------------------------------------------------------------
LOGS_EXAMPLE = "epoch 1/10 loss=2.31\nepoch 2/10 loss=1.87\n"
MULTI_EXAMPLE = "[replica 0] rank 0 ready\n[replica 1] rank 1 ready\n"


@router.get("/jobs/{job_id}/logs", summary="A job's work output (stdout, stderr), read or followed",
            tags=["jobs"], response_class=PlainTextResponse,
            description="Read from the agents of the nodes the job's attempt ran on. `attempt` defaults to the "
                        "latest, `replica` to every one (lines then carry `[replica N] ` when the job has several "
                        "replicas or gang members); `stream=both` interleaves whole lines of stdout and stderr; "
                        "`tail=N` keeps the last N lines of each stream of each replica. `follow=true` streams "
                        "until the attempt's output is complete and the job has finished (waiting while it is "
                        "pending or launching), the caller disconnects, or 24 h. `404 NoLogs`: the job runs no "
                        "command, or (without follow) has no allocation yet; `503 AgentUnavailable`: a node's "
                        "agent did not answer.",
            responses={200: {"content": {"text/plain": {"schema": {"type": "string"}, "examples": {
                "one replica": {"value": LOGS_EXAMPLE}, "several replicas": {"value": MULTI_EXAMPLE}}}}}})
async def job_logs(job_id: Annotated[str, Path(max_length=64)], req: Request, caller: Caller,
                   replica: Annotated[int | None, Query(ge=0, le=4095, description="one replica or gang member")]
                   = None,
                   attempt: Annotated[int | None, Query(ge=0, le=100_000, description="default: the latest")] = None,
                   stream: LogStreamParam = "both",
                   tail: Annotated[int | None, Query(ge=1, le=100_000, description="last N lines")] = None,
                   follow: bool = False) -> Response:
    require(caller, Action.JOB_READ)
    job = await job_team(req, job_id)
    require(caller, Action.JOB_READ, job["team"])
    if not job.get("work"):
        raise ApiError(404, "NoLogs", f"job {job_id} runs no command (it only holds GPUs for work launched by its "
                                      "owner), so there are no logs", job_id=job_id)
    reader = LogReader(req, job, replica=replica, attempt=attempt, stream=stream, tail=tail)
    await reader.refresh(job)
    if not reader.targets and not follow:
        raise ApiError(404, "NoLogs", _nothing_yet(job, replica, attempt), job_id=job_id, state=job["state"])
    # problems of this first read are still problem bodies; a follower waits for an agent not yet started
    first = await reader.read(drain=not follow, mode="first" if follow else "plain")
    if not follow:
        return PlainTextResponse(first + reader.flush(), media_type=TEXT)
    return StreamingResponse(reader.follow(first), media_type=TEXT,
                             headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"})


def _nothing_yet(job: dict[str, Any], replica: int | None, attempt: int | None) -> str:
    if job["state"] in ("awaiting_approval", "pending", "launching") and attempt is None and replica is None:
        return (f"job {job['job_id']} is {job['state']}: it has not started, so there are no logs yet "
                "(follow=true waits for them)")
    which = [f"replica {replica}"] * (replica is not None) + [f"attempt {attempt}"] * (attempt is not None)
    return f"job {job['job_id']} ({job['state']}) has no allocation{' for ' + ' and '.join(which) if which else ''}, " \
           "so no logs"
