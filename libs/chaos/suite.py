"""`gpupool chaos`: fault injection under load against a `gpupool up` this command starts itself.

A load generator (load.py) submits jobs over HTTP at a steady rate (each with an Idempotency-Key, retried
until it gets a definite answer), completes running jobs after a short hold and cancels some; a third of them run a
real command on the simulated fleet, and those that end on their own must end as their exit code says. Meanwhile
rounds of faults hit the platform: SIGKILL of each service in turn (both placement replicas, at different times; the
agent while jobs' commands run on its nodes, each of which must still end with its own exit code: work.py), a
NATS restart, a PostgreSQL restart (immediate shutdown: crash recovery on start), a silenced simulated node, an agent
partitioned from the bus (through a TCP proxy this command owns) and healed, a flood of poison messages onto the
consumers' subjects, and a corrupted telemetry batch. After each round: the time until the platform served end to
end again (a probe job submitted at the fault is granted; the killed process or restarted server is back; for faults
that take nodes away, the nodes are back; for the agent, the work on its nodes ended as it should), then `gpupool
check` must pass. At the end the load is drained and every accepted job is looked up: a job the queue does not have,
that is not where the last acknowledged command put it, or whose command did not end it as its exit code says, is
lost. Results go to docs/benchmarks.md between `<!-- chaos:begin -->` and `<!-- chaos:end -->`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import nats

from libs.bench import benchdoc
from libs.chaos.load import Load
from libs.chaos.work import AgentWork, agent_only_models
from libs.check import CheckConfig, Report, check_async
from libs.contracts import subjects
from libs.devstack.stack import agent_state_dir
from libs.runtime.processes import pid_alive

SERVICES = ("inventory", "quota", "queue", "placement", "placement-2", "reclamation", "accounting", "gateway", "agent")
FAULTS = (*(f"kill:{s}" for s in SERVICES), "restart:nats", "restart:postgres", "silence:node", "partition:agent",
          "poison:consumers", "corrupt:telemetry", "forge:policy")
FLEET = "H100-80GB*8;A100-80GB*8;H200-141GB*8;L40S*8"
CHAOS_NODES = 2  # simulated nodes behind the partitionable proxy
CHAOS_MODEL = "H100-80GB"  # the second agent's nodes' GPUs
NODE_LOST_AFTER_S = 6.0
MARK_BEGIN, MARK_END = "<!-- chaos:begin -->", "<!-- chaos:end -->"


# --------------------------------------------------------------------------------------------------- the platform
class Platform:
    """`gpupool up` with its own embedded NATS and PostgreSQL (so both can be restarted), two placement replicas."""

    def __init__(self, data_dir: Path, *, log_level: str = "WARNING", extra_env: list[str] | None = None) -> None:
        self.data_dir = data_dir
        self.log_level = log_level
        self.extra_env = extra_env or []
        # Node names of this run's own: an executor empties and removes the cgroups of its node name that it does not
        # know (/sys/fs/cgroup/…/gpupool/<cluster>-<node>), so two simulated fleets on one host must not share names
        tag = uuid.uuid4().hex[:6]
        self.node_prefix, self.chaos_prefix = f"sim-{tag}", f"chaos-{tag}"
        self.proc: subprocess.Popen | None = None
        self.run: dict = {}

    def start(self, timeout: float = 180) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPOOL_")}
        self.out = open(self.data_dir / "up.out", "wb")  # noqa: SIM115
        argv = [sys.executable, "-m", "libs.cli.main", "up", "--port", "0", "--data-dir", str(self.data_dir),
                "--fleet", FLEET, "--telemetry-interval", "1", "--placement-replicas", "2",
                "--log-level", self.log_level, "--env", f"inventory:NODE_LOST_AFTER_S={NODE_LOST_AFTER_S}",
                # agents sample by change: send at least every third of that, so only a real silence is a loss
                "--env", f"agent:HEARTBEAT_S={NODE_LOST_AFTER_S / 3:g}"]
        argv += ["--env", f"agent:SIM_NODE_PREFIX={self.node_prefix}"]
        for item in self.extra_env:
            argv += ["--env", item]
        self.proc = subprocess.Popen(argv, env=env, stdout=self.out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while not (self.data_dir / "run.json").exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("gpupool up did not start:\n" + (self.data_dir / "up.out").read_text()[-4000:])
            time.sleep(0.2)
        self.reload()

    def reload(self) -> dict:
        with contextlib.suppress(FileNotFoundError, json.JSONDecodeError):
            self.run = json.loads((self.data_dir / "run.json").read_text())
        return self.run

    @property
    def gateway(self) -> str:
        return self.run["gateway_url"]

    def pid(self, name: str) -> int | None:
        doc = self.reload()
        entry = doc.get("services", {}).get(name) or doc.get("servers", {}).get(name)
        return int(entry["pid"]) if entry and entry.get("pid") else None

    def service_url(self, name: str) -> str:
        return self.reload()["services"][name]["url"]

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=90)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        with contextlib.suppress(Exception):
            self.out.close()


# ------------------------------------------------------------------------------------------ the partition proxy
class Proxy:
    """A TCP proxy in front of NATS for one agent: `partition()` cuts every connection and refuses new ones,
    `heal()` lets them through again. The agent sees what a network partition looks like: a dead socket."""

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.partitioned = False
        self._writers: set[asyncio.StreamWriter] = set()

    async def start(self) -> int:
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        return self.server.sockets[0].getsockname()[1]

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.partitioned:
            writer.transport.abort()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.transport.abort()
            return
        self._writers |= {writer, up_writer}

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            with contextlib.suppress(Exception):
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            dst.transport.abort()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
        self._writers -= {writer, up_writer}

    def partition(self) -> None:
        self.partitioned = True
        for w in list(self._writers):
            w.transport.abort()

    def heal(self) -> None:
        self.partitioned = False

    async def close(self) -> None:
        self.partition()
        self.server.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.server.wait_closed(), 5)


# --------------------------------------------------------------------------------------------------- the rounds
@dataclass
class Round:
    number: int
    spec: str  # the fault as asked for, e.g. kill:placement
    fault: str
    target: str
    started: str
    recovery_s: float | None = None
    recovered: bool = False
    check_ok: bool = False
    check_s: float = 0.0
    violations: list[str] = field(default_factory=list)
    note: str = ""


class Chaos:
    def __init__(self, platform: Platform, load: Load, rng: random.Random, *, check_settle_s: float = 45.0,
                 recovery_timeout_s: float = 120.0, say=print,  # type: ignore[no-untyped-def]
                 stop_while_down: bool = False) -> None:
        self.platform = platform
        self.load = load
        self.rng = rng
        self.check_settle_s = check_settle_s
        self.recovery_timeout_s = recovery_timeout_s
        self.say = say
        self.rounds: list[Round] = []
        self.poison_ids: set[str] = set()
        self.injected: set[tuple[str, str, int]] = set()  # (consumer, stream, seq) this run meant to dead-letter
        self.injected_ids: set[str] = set()  # envelope ids of what it published on purpose (told to the check)
        self.checks: list[Report] = []
        self._silenced = 0
        self.work = AgentWork(load, agent_only_models(FLEET, {CHAOS_MODEL}),
                              lambda node: bool(node) and str(node).startswith(platform.node_prefix + "-"), say,
                              stop_while_down=stop_while_down)

    async def setup_agent(self) -> None:
        """A second simulated agent whose NATS connection goes through the partition proxy."""
        url = urlsplit(self.platform.run["nats_url"].split(",")[0])
        self.admin_url = self.platform.run["nats_url"]
        self.proxy = Proxy(url.hostname or "127.0.0.1", url.port or 4222)
        port = await self.proxy.start()
        creds = f"{url.username}:{url.password}@" if url.username else ""
        self._start_agent(f"nats://{creds}127.0.0.1:{port}")
        async def quiet(_: Exception) -> None:  # the bus goes away on purpose here: reconnecting is the answer
            return None

        self.nc = await nats.connect(self.admin_url, name="gpupool-chaos", max_reconnect_attempts=-1,
                                     reconnect_time_wait=0.5, error_cb=quiet)
        self.js = self.nc.jetstream(timeout=10)

    def _start_agent(self, nats_url: str) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPOOL_")}
        # its work's state and logs in a folder of this run's (one the work's unprivileged user can enter), and the
        # work goes when the agent does
        env.update(GPUPOOL_AGENT_STATE_DIR=str(agent_state_dir(self.platform.data_dir / "chaos-agent")),
                   GPUPOOL_AGENT_STOP_WORK_ON_EXIT="true")
        self.agent_log = open(self.platform.data_dir / "logs" / "chaos-agent.log", "ab")  # noqa: SIM115
        self.agent = subprocess.Popen(
            [sys.executable, "-m", "libs.cli.main", "agent", "--simulate", str(CHAOS_NODES), "--prefix",
             self.platform.chaos_prefix, "--gpus-per-node", "8", "--model", CHAOS_MODEL, "--seed", "11", "--interval", "1",
             "--nats-url", nats_url, "--log-level", "WARNING"],
            env=env, stdout=self.agent_log, stderr=subprocess.STDOUT, start_new_session=True)

    async def nodes(self) -> dict[str, dict]:
        r = await self.load.api.get("/v1/nodes", params={"limit": 1000})
        r.raise_for_status()
        return {n["node"]: n for n in r.json()["items"]}

    async def wait_fleet(self, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        want = len([n for n in FLEET.split(";") if n]) + CHAOS_NODES
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.HTTPError, ValueError, KeyError):
                nodes = await self.nodes()
                if len(nodes) >= want and all(_node_up(n) for n in nodes.values()):
                    return
            await asyncio.sleep(0.5)
        raise RuntimeError(f"the fleet ({want} nodes) did not come up within {timeout}s")

    # --- one round -----------------------------------------------------------------------------------------
    async def round(self, number: int, fault: str) -> Round:
        kind, _, target = fault.partition(":")
        r = Round(number, fault, kind, target, datetime.now(UTC).strftime("%H:%M:%S"))
        self.say(f"round {number}: {fault}")
        t0 = time.monotonic()
        try:
            if (prepare := getattr(self, f"_prepare_{kind}", None)) is not None:
                await prepare(target, r)  # what the fault is to hit is in place before the clock starts
                t0 = time.monotonic()
            waits = await getattr(self, f"_inject_{kind}")(target, r)
            probe = asyncio.create_task(self._probe(r, t0))
            recovered = await asyncio.wait_for(asyncio.gather(probe, *waits), self.recovery_timeout_s)
            r.recovered = all(x is not False for x in recovered)
            r.recovery_s = round(time.monotonic() - t0, 2)
        except TimeoutError:
            r.note += f" not recovered within {self.recovery_timeout_s:g}s"
        except Exception as exc:  # the round itself broke: reported, the next one runs
            r.note += f" {exc!r}"
        t1 = time.monotonic()
        report = await check_async(self.check_config(settle_s=self.check_settle_s))
        self.checks.append(report)
        r.check_s = round(time.monotonic() - t1, 2)
        r.check_ok = report.ok
        r.violations = [v.line() for v in report.violations][:20] + report.errors[:5]
        self.say(f"  recovered in {r.recovery_s}s; check {'ok' if r.check_ok else 'FAILED'} ({r.check_s}s)"
                 + ("".join(f"\n    {v}" for v in r.violations) if r.violations else "") + r.note)
        self.rounds.append(r)
        return r

    def check_config(self, **overrides) -> CheckConfig:  # type: ignore[no-untyped-def]
        """The liveness bounds (a job wanted 60 s must have been considered; placement must have decided since) are
        longer than any fault lasts, and the check looks again for `--settle` s: work stalled by a healed fault is
        considered within a cycle, so only a scheduler that stays stalled fails a round."""
        return CheckConfig.from_run_file(self.platform.data_dir / "run.json", outbox_max_age_s=30,
                                         lag_max_age_s=60, pending_max_age_s=60, decision_max_age_s=60,
                                         injected=frozenset(self.injected_ids), **overrides)

    async def _probe(self, r: Round, t0: float) -> bool:
        """A one-GPU job submitted at the fault: the platform serves again once it is granted."""
        job = await self.load.submit({"name": "chaos-probe", "team": "platform", "kind": "batch", "gpus": 1,
                                      "project": "probe"}, hold_s=0.5, max_delay_s=0.1)
        if job is None:
            return False
        r.note += f" probe accepted at {time.monotonic() - t0:.2f}s"
        while True:
            with contextlib.suppress(httpx.HTTPError, ValueError, KeyError):
                r = await self.load.api.get(f"/v1/jobs/{job.job_id}")
                if r.status_code == 200 and r.json()["state"] in ("running", "completed"):
                    return True
            await asyncio.sleep(0.1)

    async def _restarted(self, name: str, old_pid: int | None, ready_url: str | None = None) -> bool:
        while True:
            pid = self.platform.pid(name)
            if pid and pid != old_pid and pid_alive(pid):
                if ready_url is None:
                    return True
                url = ready_url if "://" in ready_url else self.platform.service_url(ready_url) + "/readyz"
                with contextlib.suppress(httpx.HTTPError):
                    async with httpx.AsyncClient(timeout=2) as c:
                        if (await c.get(url)).status_code == 200:
                            return True
            await asyncio.sleep(0.1)

    # --- the faults ---------------------------------------------------------------------------------------
    async def _prepare_kill(self, service: str, r: Round) -> None:
        if service == "agent":  # jobs' commands run on its nodes when it dies (work.py)
            r.target = f"agent, {await self.work.prepare()}"

    async def _inject_kill(self, service: str, r: Round) -> list:
        if service.startswith("placement"):
            r.note += f" (leader: {self.placement_leader() or '?'})"
        pid = self.platform.pid(service)
        if pid is None:
            raise RuntimeError(f"no pid for {service}")
        os.kill(pid, signal.SIGKILL)
        killed_at = time.monotonic()
        if service != "agent":
            return [self._restarted(service, pid, service)]
        restarted = asyncio.ensure_future(self._restarted(service, pid, service))

        def note(text: str) -> None:
            r.note += text

        return [restarted, self.work.verify(killed_at, restarted, note)]

    def placement_leader(self) -> str | None:
        for name in ("placement", "placement-2"):
            with contextlib.suppress(Exception), httpx.Client(timeout=2) as c:
                text = c.get(self.platform.service_url(name) + "/metrics").text
                if re.search(r'^gpupool_leader\{[^}]*\} 1(\.0)?$', text, re.M):
                    return name
        return None

    async def _inject_restart(self, server: str, r: Round) -> list:
        name = "nats" if server == "nats" else "postgres"
        pid = self.platform.pid(name)
        if pid is None:
            raise RuntimeError(f"no pid for the {name} server")
        # NATS: killed outright. PostgreSQL: immediate shutdown (every backend dies, crash recovery at start).
        os.kill(pid, signal.SIGKILL if name == "nats" else signal.SIGQUIT)
        return [self._restarted(name, pid)]

    async def _inject_silence(self, _: str, r: Round) -> list:
        main = sorted(n for n in await self.nodes() if not n.startswith(self.platform.chaos_prefix))
        node = main[self._silenced % len(main)]
        self._silenced += 1
        seconds = NODE_LOST_AFTER_S + 4
        r.target = node
        await self.nc.publish(subjects.SIM_FAULT, json.dumps({"node": node, "fault": "silence",
                                                              "seconds": seconds}).encode())
        return [self._node_cycle([node], seconds)]

    async def _inject_partition(self, _: str, r: Round) -> list:
        seconds = NODE_LOST_AFTER_S + 4
        self.proxy.partition()
        r.target = f"agent of {CHAOS_NODES} nodes, {seconds:g}s"

        async def heal() -> bool:
            await asyncio.sleep(seconds)
            self.proxy.heal()
            return True

        return [heal(), self._node_cycle([f"{self.platform.chaos_prefix}-{i}" for i in range(CHAOS_NODES)],
                                          seconds)]

    async def _node_cycle(self, names: list[str], seconds: float) -> bool:
        """The nodes were declared lost while away (reclamation then takes their GPUs back), and came back."""
        seen_lost: set[str] = set()
        while True:
            with contextlib.suppress(httpx.HTTPError, ValueError, KeyError):
                nodes = await self.nodes()
                for name in names:
                    if name in nodes and not _node_up(nodes[name]):
                        seen_lost.add(name)
                if seen_lost == set(names) and all(_node_up(nodes[n]) for n in names):
                    return True
            await asyncio.sleep(0.25)

    async def _inject_poison(self, _: str, r: Round, count: int = 60) -> list:
        targets = (subjects.JOB_SUBMITTED, subjects.JOB_CANCELLED, subjects.ALLOCATION_GRANTED,
                   subjects.ALLOCATION_RELEASED, subjects.JOB_COMPLETED)
        expected = await self._expected_dead_letters(subjects.EVENTS_STREAM.name, [
            (await self._publish_poison(self.rng.choice(targets), poison_message(self.rng, i)))
            for i in range(count)])
        r.target = f"{count} messages, {len(expected)} deliveries"
        return [self._dead_lettered(expected)]

    async def _inject_forge(self, _: str, r: Round) -> list:
        """Forged policy events (issue #16): the quota.set that once stopped every scheduling cycle, one from an
        identity that is not the quota service, one with a NUL. Each must be dead-lettered by every consumer of
        quota.set, and the round's probe job must still be granted: scheduling goes on."""
        bodies = forged_policy_events(self.rng)
        published = [await self._publish_poison(subjects.QUOTA_SET, body) for body in bodies]
        self.injected_ids |= {json.loads(body)["id"] for body in bodies}
        expected = await self._expected_dead_letters(subjects.EVENTS_STREAM.name, published)
        r.target = f"{len(bodies)} forged quota.set, {len(expected)} deliveries"
        return [self._dead_lettered(expected)]

    async def _inject_corrupt(self, _: str, r: Round) -> list:
        last = await self.js.get_last_msg(subjects.TELEMETRY_STREAM.name, subjects.TELEMETRY_ALL)
        good = last.data or b"{}"
        subject = last.subject
        batch = corrupt_telemetry(good, self.rng)
        published = [await self._publish_poison(subject, body) for body in batch]
        expected = await self._expected_dead_letters(subjects.TELEMETRY_STREAM.name, published)
        r.target = f"{len(batch)} samples on {subject}"
        return [self._dead_lettered(expected)]

    async def _publish_poison(self, subject: str, body: bytes) -> tuple[str, int]:
        msg_id = f"chaos-poison-{uuid.uuid4()}"
        self.poison_ids.add(msg_id)
        with contextlib.suppress(ValueError, UnicodeDecodeError, TypeError, KeyError):
            self.injected_ids.add(str(json.loads(body)["id"]))  # a poison CloudEvent's own id
        ack = await self.js.publish(subject, body, headers={"Nats-Msg-Id": msg_id})
        return subject, ack.seq

    async def _expected_dead_letters(self, stream: str,
                                     published: list[tuple[str, int]]) -> set[tuple[str, str, int]]:
        """(consumer, stream seq) for every durable consumer whose filter takes each poison message."""
        consumers = [(c.config.durable_name, c.config.filter_subjects or [c.config.filter_subject or ">"])
                     for c in await self.js.consumers_info(stream) if c.config.durable_name]
        expected = {(name, stream, seq) for subject, seq in published for name, filters in consumers
                    if any(subjects.matches(f, subject) for f in filters)}
        self.injected |= expected
        return expected

    async def dead_letters(self) -> list[dict]:
        """Every dead letter, with whether this run put it there on purpose."""
        out = []
        info = await self.js.stream_info(subjects.DLQ_STREAM.name)
        seq = info.state.first_seq
        while info.state.messages and seq <= info.state.last_seq:
            try:
                m = await self.js.get_msg(subjects.DLQ_STREAM.name, seq=seq, next=True)
            except Exception:
                break
            h = m.headers or {}
            key = (h.get("Gpupool-Dlq-Consumer"), h.get("Gpupool-Dlq-Stream"), int(h.get("Gpupool-Dlq-Stream-Seq", "0")))
            out.append({"consumer": key[0], "reason": h.get("Gpupool-Dlq-Reason"), "subject": h.get("Gpupool-Dlq-Subject"),
                        "error": (h.get("Gpupool-Dlq-Error") or "")[:160], "injected": key in self.injected})
            seq = m.seq + 1
        return out

    async def _dead_lettered(self, expected: set[tuple[str, str, int]]) -> bool:
        """Every expected (consumer, message) is in the dead-letter stream: the consumers went on past them."""
        while True:
            found = set()
            with contextlib.suppress(Exception):
                info = await self.js.stream_info(subjects.DLQ_STREAM.name)
                first = max(1, info.state.last_seq - 20 * len(expected) - 1000)
                seq = first
                while seq <= info.state.last_seq:
                    try:
                        m = await self.js.get_msg(subjects.DLQ_STREAM.name, seq=seq, next=True)
                    except Exception:
                        break
                    h = m.headers or {}
                    found.add((h.get("Gpupool-Dlq-Consumer"), h.get("Gpupool-Dlq-Stream"),
                               int(h.get("Gpupool-Dlq-Stream-Seq", "0"))))
                    seq = m.seq + 1
            if expected <= found:
                return True
            await asyncio.sleep(0.5)

    async def close(self) -> None:
        self.work.close()
        with contextlib.suppress(Exception):
            self.agent.send_signal(signal.SIGTERM)
            self.agent.wait(timeout=15)
        with contextlib.suppress(Exception):
            self.agent.kill()
        with contextlib.suppress(Exception):
            self.agent_log.close()
        with contextlib.suppress(Exception):
            await self.proxy.close()
        with contextlib.suppress(Exception):
            await self.nc.close()


def _node_up(n: dict) -> bool:
    return n.get("state") == "ready"


def poison_message(rng: random.Random, i: int) -> bytes:
    """One message no consumer can apply: bytes that are not JSON, JSON that is not a CloudEvent, an unknown
    (future) version of a known type, a known type whose payload is wrong, or an oversized document."""
    now = datetime.now(UTC).isoformat()
    kind = i % 6
    if kind == 0:
        return bytes(rng.getrandbits(8) for _ in range(rng.randint(1, 64)))
    if kind == 1:
        return json.dumps({"hello": "world", "n": i}).encode()
    if kind == 2:
        return json.dumps({"specversion": "1.0", "id": str(uuid.uuid4()), "source": "/gpupool/chaos",
                           "type": "io.gpupool.job.submitted.v9", "time": now, "data": {"job_id": "x"}}).encode()
    if kind == 3:
        return json.dumps({"specversion": "1.0", "id": str(uuid.uuid4()), "source": "/gpupool/chaos",
                           "type": "io.gpupool.allocation.granted.v1", "time": now,
                           "data": {"allocation_id": 7, "gpus": "all"}}).encode()
    if kind == 4:
        return json.dumps({"specversion": "0.3", "id": str(uuid.uuid4()), "source": "/gpupool/chaos",
                           "type": "io.gpupool.job.cancelled.v1", "time": now, "data": {}}).encode()
    return json.dumps({"specversion": "1.0", "id": str(uuid.uuid4()), "source": "/gpupool/chaos",
                       "type": "io.gpupool.job.completed.v1", "time": now,
                       "data": {"job_id": "x" * 300_000}}).encode()


def forged_policy_events(rng: random.Random) -> list[bytes]:
    """quota.set events a forger with publish rights on the subject sends: the quota service's source with
    numbers that overflow the scheduler (guaranteed 1e308, a revision of 10^12), another identity's source with a
    plausible body, and a NUL in a field PostgreSQL stores as text."""
    now = datetime.now(UTC).isoformat()

    def quota_set(source: str, **data: object) -> bytes:
        body = {"path": "default/platform", "gpu_model": "*", "guaranteed": 0.0, "borrowing_limit": 0.0,
                "lending_limit": None, "weight": 1.0, "deleted": False, "revision": 10**12, "set_at": now,
                "loaned": 0.0, **data}
        return json.dumps({"specversion": "1.0", "id": str(uuid.uuid4()), "source": source,
                           "type": "io.gpupool.quota.set.v1", "subject": body["path"], "time": now,
                           "data": body}).encode()

    return [quota_set("/gpupool/quota", guaranteed=1e308),
            quota_set("/gpupool/agent", revision=rng.randint(10**6, 10**9)),
            quota_set("/gpupool/quota", gpu_model="H100\u0000")]


def corrupt_telemetry(good: bytes, rng: random.Random) -> list[bytes]:
    """A telemetry batch gone bad on the wire: truncated, bit-flipped, with nonsense readings, of another type."""
    out = [good[: max(1, len(good) // 2)]]
    flipped = bytearray(good)
    for _ in range(8):
        pos = rng.randrange(len(flipped))
        flipped[pos] ^= 0xFF
    out.append(bytes(flipped))
    with contextlib.suppress(ValueError):
        doc = json.loads(good)
        doc["id"] = str(uuid.uuid4())
        doc["data"]["gpus"] = [{"uuid": 7, "utilization_pct": "hot"}]
        out.append(json.dumps(doc).encode())
        doc["type"] = "io.gpupool.node.registered.v1"
        doc["id"] = str(uuid.uuid4())
        out.append(json.dumps(doc).encode())
    return out


# ------------------------------------------------------------------------------------------------------ running
async def run_chaos(*, rounds: int, rate: float = 3.0, faults: list[str] | None = None, seed: int = 0,
                    data_dir: Path | None = None, settle_s: float = 45.0, warmup_s: float = 5.0,
                    gap_s: float = 3.0, say=print, log_level: str = "WARNING",  # type: ignore[no-untyped-def]
                    before_stop: Callable[[Platform, frozenset[str]], Awaitable[None]] | None = None,
                    stop_while_down: bool = False) -> dict:
    """Start a platform, run `rounds` rounds cycling through `faults` under load, drain, tally. Returns the
    results (what `write_markdown` renders). `before_stop` may look at the drained platform before it stops (with the ids of the events this run injected
    on purpose, for a check of its own).
    `stop_while_down`: the `kill:agent` round also stops work while the agent is down (work.py)."""
    rng = random.Random(seed)
    plan = [(faults or list(FAULTS))[i % len(faults or FAULTS)] for i in range(rounds)]
    own_dir = data_dir is None
    data_dir = Path(tempfile.mkdtemp(prefix="gpupool-chaos-")) if data_dir is None else data_dir
    data_dir.mkdir(parents=True, exist_ok=True)
    platform = Platform(data_dir, log_level=log_level)
    started = time.monotonic()
    say(f"starting gpupool up in {data_dir} …")
    await asyncio.to_thread(platform.start)
    load = Load(platform.gateway, platform.run["admin_token"], rate, rng)
    chaos = Chaos(platform, load, rng, check_settle_s=settle_s, say=say, stop_while_down=stop_while_down)
    result: dict = {}
    try:
        await chaos.setup_agent()
        await chaos.wait_fleet()
        say(f"fleet up; load at {rate:g} jobs/s")
        load.start()
        await asyncio.sleep(warmup_s)
        for i, fault in enumerate(plan, 1):
            await chaos.round(i, fault)
            await asyncio.sleep(gap_s)
        say("draining the load …")
        tally = load.verdict(await load.drain())
        final = await check_async(chaos.check_config(settle_s=settle_s))
        chaos.checks.append(final)
        double = sum(1 for rep in chaos.checks for v in rep.violations if v.check == "gpu_exclusive")
        dead: dict[str, dict] = {}
        for d in await chaos.dead_letters():
            entry = dead.setdefault(f"{d['consumer']} / {d['reason']}", {"injected": 0, "other": 0, "examples": []})
            entry["injected" if d["injected"] else "other"] += 1
            if not d["injected"] and len(entry["examples"]) < 2:
                entry["examples"].append(f"{d['subject']}: {d['error']}")
        result = {
            "rounds": [asdict(r) for r in chaos.rounds],
            "rounds_survived": sum(1 for r in chaos.rounds if r.recovered and r.check_ok),
            "rounds_total": len(chaos.rounds),
            "jobs": tally,
            "load": asdict(load.stats),
            "double_allocations": double,
            "final_check": {"ok": final.ok, "violations": [v.line() for v in final.violations][:50],
                            "errors": final.errors},
            "dead_letters": dead,
            "poison_published": len(chaos.poison_ids),
            "duration_s": round(time.monotonic() - started, 1),
            "rate": rate,
            "seed": seed,
            "data_dir": str(data_dir),
        }
        if before_stop is not None:
            await before_stop(platform, frozenset(chaos.injected_ids))
        return result
    finally:
        await load.stop()
        await load.close()
        await chaos.close()
        await asyncio.to_thread(platform.stop)
        if own_dir and result and result["rounds_survived"] == result["rounds_total"] and result["jobs"]["lost"] == 0:
            shutil.rmtree(data_dir, ignore_errors=True)


def passed(result: dict) -> bool:
    return (result["rounds_survived"] == result["rounds_total"] and result["jobs"]["lost"] == 0
            and result["double_allocations"] == 0 and result["final_check"]["ok"])


def render_markdown(result: dict, command: str) -> str:
    rounds = result["rounds"]
    per_fault: dict[str, list[float]] = {}
    for r in rounds:
        if r["recovery_s"] is not None:
            per_fault.setdefault(r["spec"], []).append(r["recovery_s"])
    jobs = result["jobs"]
    lines = [
        MARK_BEGIN,
        "## Fault injection (`task chaos`)",
        "",
        f"Machine: {benchdoc.machine()}. Command: `{command}` ({datetime.now(UTC):%Y-%m-%d}, "
        f"{result['duration_s']:g} s, "
        f"load {result['rate']:g} jobs/s, seed {result['seed']}). Every service, NATS and PostgreSQL on this "
        "machine; `gpupool up --placement-replicas 2` with its own embedded servers; 4 simulated nodes on the "
        f"platform's agent and {CHAOS_NODES} on a second agent behind a partitionable proxy.",
        "",
        "| rounds survived | jobs accepted | jobs lost | double allocations | `gpupool check` after every round |",
        "| --- | --- | --- | --- | --- |",
        f"| {result['rounds_survived']} / {result['rounds_total']} | {jobs['accepted']} | {jobs['lost']} | "
        f"{result['double_allocations']} | {sum(1 for r in rounds if r['check_ok'])} / {len(rounds)} passed; final "
        f"check {'passed' if result['final_check']['ok'] else 'FAILED'} |",
        "",
        f"Final job states: {', '.join(f'{k} {v}' for k, v in sorted(jobs['final_states'].items()))}. "
        f"Submissions retried with the same Idempotency-Key while a fault lasted: {result['load']['retried']}; "
        f"refused: {result['load']['rejected'] or 'none'}.",
        "",
        f"Jobs with a command, run by the agents as real processes: {jobs.get('work_jobs', 0)} "
        f"({', '.join(f'{v} {k}' for k, v in sorted(jobs.get('work_outcomes', {}).items())) or 'none'}); "
        f"ended otherwise than their exit code says: {len(jobs.get('work_misended', []))}.",
        "",
        "Recovery time per fault (from the fault until a probe job submitted at that moment is granted, the killed "
        "process or restarted server answers again, and nodes taken away are back; for `kill:agent`, until the work "
        "on its nodes ended as its exit codes say and the stopped work was released with its exit):",
        "",
        "| fault | rounds | median s | max s |",
        "| --- | --- | --- | --- |",
    ]
    for fault, values in sorted(per_fault.items()):
        lines.append(f"| {fault} | {len(values)} | {statistics.median(values):.2f} | {max(values):.2f} |")
    lines += ["", "| round | fault | target | recovery s | check | check s | note |",
              "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in rounds:
        lines.append(f"| {r['number']} | {r['spec']} | {r['target']} | {r['recovery_s']} | "
                     f"{'ok' if r['check_ok'] else 'FAILED: ' + '; '.join(r['violations'][:3])} | {r['check_s']} | "
                     f"{r['note'].strip()} |")
    lines += ["", f"Dead letters by consumer and cause. *Injected*: a poison message or corrupted telemetry sample this "
              f"run published ({result['poison_published']} messages, each dead-lettered once per consumer that "
              "takes its subject). *Other*: anything else; a dead-lettered event that a service emitted through its "
              "outbox would also fail `gpupool check` (dead_letters).", "",
              "| consumer / reason | injected | other | example of other |", "| --- | --- | --- | --- |"]
    for key, d in sorted(result["dead_letters"].items()):
        example = (d["examples"][0] if d["examples"] else "").replace("|", "\\|")
        lines.append(f"| {key} | {d['injected']} | {d['other']} | {example} |")
    lines += ["", MARK_END]
    return "\n".join(lines)


def write_markdown(path: Path, section: str) -> None:
    text = path.read_text() if path.exists() else "# Benchmarks\n"
    if MARK_BEGIN in text and MARK_END in text:
        before, rest = text.split(MARK_BEGIN, 1)
        _, after = rest.split(MARK_END, 1)
        text = before + section + after
    else:
        text = text.rstrip("\n") + "\n\n" + section + "\n"
    path.write_text(text)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="gpupool chaos", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="faults: " + ", ".join(FAULTS))
    p.add_argument("--rounds", type=int, default=len(FAULTS), help=f"rounds to run (default {len(FAULTS)}: each "
                                                                    "fault once); faults are taken in turn")
    p.add_argument("--faults", default=None, metavar="F[,F]", help="only these faults")
    p.add_argument("--rate", type=float, default=3.0, help="submissions per second (default 3)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--settle", type=float, default=45.0, metavar="S",
                   help="how long `gpupool check` may look again before a round fails (default 45)")
    p.add_argument("--data-dir", type=Path, default=None, help="the platform's data (default: a temporary folder)")
    p.add_argument("--out", type=Path, default=Path("docs/benchmarks.md"),
                   help="markdown file whose chaos section is rewritten (default docs/benchmarks.md)")
    p.add_argument("--no-write", action="store_true", help="do not touch the markdown file")
    p.add_argument("--json", type=Path, default=None, help="also write the full results as JSON here")
    p.add_argument("--log-level", default="WARNING", help="the platform's log level (default WARNING)")
    p.add_argument("--stop-while-down", action="store_true",
                   help="kill:agent also cancels a running job while the agent is down (and the load goes on "
                        "completing and cancelling): its re-adopted work must still be stopped and reported")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    faults = args.faults.split(",") if args.faults else None
    if faults and not set(faults) <= set(FAULTS):
        print(f"gpupool chaos: unknown fault(s) {sorted(set(faults) - set(FAULTS))}; known: {', '.join(FAULTS)}",
              file=sys.stderr)
        return 2
    result = asyncio.run(run_chaos(rounds=args.rounds, rate=args.rate, faults=faults, seed=args.seed,
                                   data_dir=args.data_dir, settle_s=args.settle, log_level=args.log_level,
                                   say=lambda line: print(line, flush=True), stop_while_down=args.stop_while_down))
    shown = list(argv if argv is not None else sys.argv[2:])
    for flag in ("--json", "--out", "--data-dir"):  # where files went is not how the run was made
        while flag in shown and shown.index(flag) + 1 < len(shown):
            i = shown.index(flag)
            del shown[i:i + 2]
    command = "gpupool chaos " + " ".join(x for x in shown if x != "--no-write")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2, default=str))
    if not args.no_write:
        write_markdown(args.out, render_markdown(result, command.strip()))
    summary = (f"rounds survived {result['rounds_survived']}/{result['rounds_total']}, jobs accepted "
               f"{result['jobs']['accepted']}, lost {result['jobs']['lost']}, double allocations "
               f"{result['double_allocations']}, final check {'ok' if result['final_check']['ok'] else 'FAILED'}")
    print(summary)
    return 0 if passed(result) else 1


if __name__ == "__main__":
    sys.exit(main())
