"""The work side of the `kill:agent` chaos round: the platform's agent is SIGKILLed while jobs' commands run on its
nodes, and every one of them must still end as its exit code says.

Before the kill the round starts its own marker jobs, each on a GPU only the platform's agent has, and waits until
they run. Each waits for a gate file the round opens right after the SIGKILL: two then exit at once (5, and 0) —
while the agent is down, so the restarted agent reports them from the status files the per-attempt shims left —,
one sleeps 4 s first (its shim is re-adopted and watched by the new agent) and exits 6, and one never ends on its
own: once the others are reported the round cancels it, and the restarted agent must stop it and report its exit
(the GPUs go back only then). The load's jobs with a command that were launching or running on the agent's nodes
at the kill, or were granted while it was down, are watched too: within `WORK_BOUND_S` of the kill none may still
be launching, and those that end on their own must have ended with their exit code — none `Lost`.

While the agent is down the load completes and cancels nothing (`Load.paused`): a stop asked for then is not
delivered to re-adopted work yet. `stop_while_down` asks for one on purpose — a fifth marker cancelled right after
the kill, which must be stopped and released with its exit like the others — and lets the load go on.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx

from libs.chaos.load import STOP_GRACE_S, TERMINAL, Job, Load
from libs.check.invariants import RELEASED_WITHOUT_EXIT

WORK_BOUND_S = 45.0  # from the kill: every watched job ended as it should, none still launching
RUNNING_TIMEOUT_S = 60.0  # for the markers to be running before the kill
# label, script after the gate, (state, exit code) it must end in on its own, or when the round cancels it
MARKERS: tuple[tuple[str, str, tuple[str, int] | str], ...] = (
    ("exit5-while-down", "exit 5", ("failed", 5)),
    ("exit0-while-down", "exit 0", ("completed", 0)),
    ("exit6-adopted", "sleep 4; exit 6", ("failed", 6)),
    ("stopped-adopted", "sleep 600", "back"),  # cancelled once the restarted agent reported the others
    ("stopped-while-down", "sleep 600", "down"),  # cancelled right after the kill (only with stop_while_down)
)


def agent_only_models(fleet: str, others: set[str]) -> list[str]:
    """GPU models of `fleet` ('H100-80GB*8;A100-80GB*8') that no other agent's nodes have."""
    models = {part.split("*")[0].strip() for node in fleet.split(";") for part in node.split(",") if part.strip()}
    return sorted(models - others)


class AgentWork:
    """Marker jobs and the load's command jobs on the platform agent's nodes, around one SIGKILL of the agent."""

    def __init__(self, load: Load, models: list[str], on_agent: Callable[[str | None], bool],
                 say: Callable[[str], Any] = print, *, stop_while_down: bool = False) -> None:
        self.load = load
        self.models = models
        self.on_agent = on_agent  # node name → whether the platform's agent runs it
        self.say = say
        self.stop_while_down = stop_while_down
        self.gate_dir = Path(tempfile.mkdtemp(prefix="gpupool-chaos-gate-"))
        self.gate_dir.chmod(0o755)  # the work runs as an unprivileged user: it must see the gate open
        self.count = 0
        self.gate = self.gate_dir / "open-0"
        self.markers: list[tuple[str, Job, str | None]] = []  # label, job, when the round cancels it
        self.at_kill: set[str] = set()

    def _body(self, label: str, script: str) -> dict:
        wait = f"while [ ! -e {self.gate} ]; do sleep 0.05; done; "
        return {"name": f"chaos-agent-{label}", "team": "platform", "kind": "batch", "gpus": 1, "project": "chaos",
                "gpu_models": self.models, "command": ["sh", "-c", wait + script], "stop_grace_s": STOP_GRACE_S}

    async def prepare(self) -> str:
        """The markers are submitted and running; what else of the load's work runs on the agent is noted."""
        self.count += 1
        self.gate = self.gate_dir / f"open-{self.count}"
        self.markers = []
        try:
            give_up = time.monotonic() + RUNNING_TIMEOUT_S
            for label, script, end in MARKERS:
                if end == "down" and not self.stop_while_down:
                    continue
                expect = end if isinstance(end, tuple) else None
                job = await self.load.submit(self._body(label, script), hold_s=0, give_up_at=give_up,
                                             work="marker", expect=expect, managed=False)
                if job is None:
                    raise RuntimeError(f"marker job {label} was not accepted")
                self.markers.append((label, job, None if expect else str(end)))
            while True:
                views = await self._views([j.job_id for _, j, _ in self.markers])
                if all(v.get("state") == "running" for v in views.values()):
                    break
                if time.monotonic() > give_up:
                    raise RuntimeError(f"marker jobs not running within {RUNNING_TIMEOUT_S:g}s: " + ", ".join(
                        f"{lbl} {views.get(j.job_id, {}).get('state')}" for lbl, j, _ in self.markers))
                await asyncio.sleep(0.2)
            self.at_kill = await self._load_work_on_agent()
        except BaseException:
            self.open_gate()  # nothing waits on them any more: let them end
            raise
        self.load.paused = not self.stop_while_down  # until the restarted agent is seen reporting
        return f"{len(self.markers)} marker jobs and {len(self.at_kill)} of the load's running"

    def open_gate(self) -> None:
        with contextlib.suppress(OSError):
            self.gate.touch()

    async def verify(self, killed_at: float, restarted: Awaitable[bool], note: Callable[[str], None]) -> bool:
        """After the SIGKILL: open the gate, wait for the restarted agent, then for every watched job to end as it
        should (the cancelled markers: their allocations released with the exits the new agent reported)."""
        self.open_gate()
        try:
            for _, job, when in self.markers:
                if when == "down":
                    await self.load.finish(job, "cancel")
            if not await restarted:
                return False
            return await self._settle(killed_at, time.monotonic() - killed_at, note)
        finally:
            self.load.paused = False

    async def _settle(self, killed_at: float, back_s: float, note: Callable[[str], None]) -> bool:
        watched = self.at_kill | await self._load_work_on_agent()
        natural = {j.job_id for _, j, when in self.markers if when is None}
        stops = {j.job_id: j for _, j, when in self.markers if when is not None}
        expect = {i: self.load.jobs[i] for i in natural | {i for i in watched if self.load.jobs[i].expect}}
        released: dict[str, float] = {}
        resumed = False
        deadline = killed_at + WORK_BOUND_S
        while True:
            views = await self._views([*expect, *watched, *stops])
            ended = {i for i, v in views.items() if v.get("state") in TERMINAL}
            if natural <= ended and not resumed:  # the restarted agent reports: stops reach it again
                resumed, self.load.paused = True, False
            for _, job, when in self.markers:
                if (when == "down" or when == "back" and resumed) and not (job.acked or job.closed):
                    await self.load.finish(job, "cancel")
            for i, job in stops.items():
                if i not in released and job.acked and await self._released_with_exit(i):
                    released[i] = time.monotonic() - killed_at
            waiting = sorted(i for i in {*expect, *watched}
                             if views.get(i, {}).get("state") == "launching" or i in expect and i not in ended)
            if len(released) == len(stops) and not waiting:
                break
            if time.monotonic() > deadline:
                note(f" work not settled {WORK_BOUND_S:g}s after the kill: " + "; ".join(
                    [f"{i} still {views.get(i, {}).get('state')}" for i in waiting[:10]]
                    + [f"{i} cancelled, not released with an exit" for i in stops if i not in released]))
                return False
            await asyncio.sleep(0.3)
        got = {i: views.get(i, {}) for i in expect}
        wrong = [f"{i} {v.get('state')}/{v.get('exit_code')} ({v.get('reason')}), expected "
                 f"{'/'.join(map(str, expect[i].expect or ()))}" for i, v in got.items()
                 if (v.get("state"), v.get("exit_code")) != expect[i].expect]
        requeued = sum(1 for i in [*expect, *stops] if views.get(i, {}).get("attempts"))
        note(f" agent back in {back_s:.2f}s; {len(expect)} jobs ended as their exit codes said"
             f"{'' if not wrong else ' but ' + str(len(wrong)) + ' did not'}; {len(watched)} of the load's watched; "
             f"cancelled re-adopted work released at {max(released.values()):.2f}s"
             + (f"; {requeued} requeued (their nodes declared lost while the agent was away)" if requeued else ""))
        if wrong:
            note(" WRONG: " + "; ".join(wrong[:10]))
        return not wrong

    async def _views(self, job_ids: list[str]) -> dict[str, dict]:
        out: dict[str, dict] = {}
        for job_id in dict.fromkeys(job_ids):
            with contextlib.suppress(httpx.HTTPError, ValueError):
                r = await self.load.api.get(f"/v1/jobs/{job_id}")
                if r.status_code == 200:
                    out[job_id] = r.json()
        return out

    async def _load_work_on_agent(self) -> set[str]:
        """The load's jobs with a command launching or running on the platform agent's nodes now."""
        for _ in range(20):
            with contextlib.suppress(httpx.HTTPError, ValueError, KeyError):
                views = await self.load.views(("launching", "running"))
                return {i for i, v in views.items() if i in self.load.jobs and self.load.jobs[i].work is not None
                        and self.load.jobs[i].work != "marker" and self.on_agent(v.get("node"))}
            await asyncio.sleep(0.25)
        return set()

    async def _released_with_exit(self, job_id: str) -> bool:
        """Every allocation of the job released, each with the exit its agent reported — but one released because
        its node was declared lost (the agent away too long: the job was requeued), which carries none."""
        with contextlib.suppress(httpx.HTTPError, ValueError, KeyError):
            r = await self.load.api.get("/v1/allocations", params={"job_id": job_id, "limit": 100})
            items = r.json()["items"] if r.status_code == 200 else []
            return bool(items) and all(a.get("released_at") and (a.get("exit") or a.get("release_reason") in
                                                                 RELEASED_WITHOUT_EXIT) for a in items)
        return False

    def close(self) -> None:
        self.open_gate()
        shutil.rmtree(self.gate_dir, ignore_errors=True)
