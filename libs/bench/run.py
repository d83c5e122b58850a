"""`gpupool run -- true` benchmark: a command's whole cycle on a real `gpupool up` whose agent runs each job's
command as a real process (the executor's shim, the job's cgroup), beside Slurm's `srun true` and `sbatch` on the
tuned Slurm peer (../shared/peers/slurm, `setup.sh fast`) in the same command.

Phases of each run (a fresh platform per run; with --slurm the Slurm runs are interleaved with gpupool's):
  cycle   N one-GPU `["true"]` jobs, one at a time, submitted over HTTP; the job's events as NATS delivers them
          time each phase: submit → allocation.granted → agent.work_started (process started) →
          agent.work_exited (exited) → allocation.released (GPUs free).
  cli     N times the real CLI, `gpupool run --team T -- true`, as a subprocess: its wall time (what a user waits),
          and where in it the process started and the GPUs were freed; plus the CLI's start-up alone
          (`gpupool run --help`: the same imports, no request).
  paced   `["true"]` jobs submitted open-loop at each rate for S seconds: submit → process started and
          submit → GPUs free, and how many started.
  slurm   N sequential `srun -N1 -n1 --gres=gpu:1 -t 1 true` (wall time), and one-GPU batch jobs submitted with
          `sbatch` at the same rates for the same S seconds, timed from Slurm's own records by the peer's bench.py:
          the batch script's own start time and slurmctld's log (submit, allocation, `_job_complete ... done`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import importlib.util
import json
import os
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from types import ModuleType

import nats

from libs.bench import benchdoc
from libs.bench.e2e import Platform, api_token, pct

BEGIN, END = "<!-- run-benchmark:begin -->", "<!-- run-benchmark:end -->"
FLEET = ";".join(["H100-80GB*8"] * 16)  # 128 GPUs: 50 jobs/s of short jobs with seconds of slack each
TEAM = "research"
WARMUP = 3  # jobs (and srun calls) before each measured sequence, not counted
SLURM_PEER = Path(__file__).resolve().parents[2].parent / "shared" / "peers" / "slurm"
SUBJECTS = {"gpupool.allocation.granted": "granted", "gpupool.agent.work_started": "started",
            "gpupool.agent.work_exited": "exited", "gpupool.allocation.released": "released"}
SPANS = (("submit_granted", "submit", "granted"), ("granted_started", "granted", "started"),
         ("started_exited", "started", "exited"), ("exited_released", "exited", "released"),
         ("submit_started", "submit", "started"), ("submit_released", "submit", "released"),
         ("submit_ran", "submit", "ran"), ("ran_started", "ran", "started"), ("ran_ended", "ran", "ended"))
SUBMITTED = re.compile(r"submitted job (\S+)")


# --- pure parts -------------------------------------------------------------------------------------------------
def summarize(xs: list[float]) -> dict:
    """n, p50, p99, max and mean of a list of seconds (NaN where empty), as the Slurm peer's bench.py does."""
    nan = float("nan")
    return {"n": len(xs), "p50": pct(xs, 50), "p99": pct(xs, 99), "max": max(xs) if xs else nan,
            "mean": statistics.fmean(xs) if xs else nan}


def spans(marks: dict[str, float]) -> dict[str, float]:
    """The phases of one job from the times its marks were seen (submit, granted, started, exited, released;
    ran and ended: the executor's own record of the process's start and end); a phase whose two ends were not
    both seen is left out."""
    return {name: marks[b] - marks[a] for name, a, b in SPANS if a in marks and b in marks}


def summarize_spans(jobs: list[dict[str, float]], names: tuple[str, ...] | None = None) -> dict[str, dict]:
    names = names or tuple(n for n, _, _ in SPANS)
    return {n: summarize([j[n] for j in jobs if n in j]) for n in names}


def cli_job_id(stderr: str) -> str | None:
    """The job id `gpupool run` reports on stderr ("gpupool: submitted job ID (...)")."""
    m = SUBMITTED.search(stderr)
    return m.group(1) if m else None


def cpu_times() -> tuple[float, float]:
    """(busy, total) jiffies of the whole machine, from /proc/stat."""
    try:
        fields = [float(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return 0.0, 0.0
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0.0)
    return sum(fields) - idle, sum(fields)


def busy_pct(before: tuple[float, float], after: tuple[float, float]) -> float:
    total = after[1] - before[1]
    return 100.0 * (after[0] - before[0]) / total if total > 0 else float("nan")


def idle_busy(seconds: float) -> float:
    """The whole machine's CPU busy % over `seconds` while this command does nothing: other users' load."""
    before = cpu_times()
    time.sleep(seconds)
    return busy_pct(before, cpu_times())


def med(values: list[float | None]) -> float:
    xs = [v for v in values if v is not None and v == v]
    return statistics.median(xs) if xs else float("nan")


def dig(doc: object, path: tuple[str, ...]) -> object:
    for key in path:
        doc = doc.get(key) if isinstance(doc, dict) else None
    return doc


def ratio(ours: float, theirs: float) -> str:
    """How gpupool compares with Slurm on a time (lower is better), in words."""
    if not (ours == ours and theirs == theirs) or ours <= 0 or theirs <= 0:
        return "–"
    return f"gpupool {theirs / ours:.1f}x faster" if ours <= theirs else f"gpupool {ours / theirs:.1f}x slower"


def ms(x: object) -> str:
    return f"{round(1000 * x) or 0:.0f} ms" if isinstance(x, int | float) and x == x else "–"


def cgroup_kind() -> str:
    """Which cgroup hierarchies this machine mounts (read from /proc/self/mounts; libs never import a service, so
    this is not the executor's own detection, only what it chooses from)."""
    try:
        with open("/proc/self/mounts") as f:
            kinds = {line.split()[2] for line in f if line.split()[2] in ("cgroup", "cgroup2")}
    except OSError as exc:  # the report still comes
        return f"cgroups unknown ({type(exc).__name__})"
    if kinds == {"cgroup", "cgroup2"}:
        return "cgroup v1 controllers + a v2 mount (hybrid)"
    return {"cgroup": "cgroup v1", "cgroup2": "cgroup v2"}.get(next(iter(kinds), ""), "no cgroups mounted")


# --- gpupool: the job's events as NATS delivers them ------------------------------------------------------------
class Events:
    """When each job's granted, started, exited and released events reached this process (first copy of each;
    redeliveries are ignored), and how each allocation was released."""

    def __init__(self) -> None:
        self.marks: dict[str, dict[str, float]] = {}
        self.released: dict[str, str] = {}  # job → release reason
        self.changed = asyncio.Event()
        self.nc: nats.NATS | None = None
        self.offset = time.time() - time.monotonic()  # the executor's wall-clock records → this monotonic clock

    def on(self, subject: str, data: dict, at: float) -> None:
        mark = SUBJECTS.get(subject) or SUBJECTS.get(subject.rsplit(".", 2)[0])
        job = data.get("job_id")
        if mark is None or not job:
            return
        marks = self.marks.setdefault(job, {})
        marks.setdefault(mark, at)
        exit = data.get("exit") or {}
        for key, name in (("started_at", "ran"), ("exited_at", "ended")):
            if exit.get(key) and name not in marks:
                with contextlib.suppress(TypeError, ValueError):
                    marks[name] = dt.datetime.fromisoformat(exit[key]).timestamp() - self.offset
        if mark == "released":
            why = str(data.get("reason", ""))
            self.released.setdefault(job, f"{why} ({exit['reason']})" if exit.get("reason") else why)
        self.changed.set()

    async def start(self, nats_url: str) -> None:
        self.nc = await nats.connect(servers=nats_url.split(","))

        async def cb(msg) -> None:  # type: ignore[no-untyped-def]
            with contextlib.suppress(ValueError, TypeError, AttributeError):
                self.on(msg.subject, json.loads(msg.data).get("data") or {}, time.monotonic())

        await self.nc.subscribe("gpupool.agent.>", cb=cb)
        await self.nc.subscribe("gpupool.allocation.>", cb=cb)
        await self.nc.flush()

    async def wait(self, done, timeout: float) -> bool:  # type: ignore[no-untyped-def]
        """Until `done()` holds or `timeout` seconds have passed; whether it holds."""
        deadline = time.monotonic() + timeout
        while not done():
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            self.changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.changed.wait(), min(left, 0.5))
        return True

    def job(self, job_id: str, **extra: float) -> dict[str, float]:
        return {**extra, **self.marks.get(job_id, {})}

    async def close(self) -> None:
        if self.nc is not None:
            await self.nc.close()


def job_body(name: str) -> dict:
    return {"name": name, "team": TEAM, "gpus": 1, "command": ["true"]}


async def http_cycles(run: dict, token: str, events: Events, n: int, timeout: float = 60.0) -> dict:
    """`n` jobs one at a time over HTTP, each waited for until its GPUs are free."""
    from libs.bench.loadgen import Client

    api = Client(run["gateway_url"], token, size=2)
    jobs: list[dict[str, float]] = []
    failures: list[str] = []
    try:
        for i in range(WARMUP + n):
            t0 = time.monotonic()
            status, body = await api.call("POST", "/v1/jobs", job_body(f"cycle-{i}"))
            if status not in (200, 201):
                failures.append(f"{status}: {body}")
                continue
            job_id = body["job_id"]
            if not await events.wait(lambda j=job_id: "released" in events.marks.get(j, {}), timeout):
                failures.append(f"job {job_id} not released after {timeout:g} s: {events.job(job_id)}")
            await events.wait(lambda j=job_id: "started" in events.marks.get(j, {}), 2.0)
            if i >= WARMUP:
                jobs.append(spans(events.job(job_id, submit=t0)))
    finally:
        await api.close()
    return {**summarize_spans(jobs), "failures": len(failures), "failure_examples": failures[:3]}


PACED_SPANS = ("submit_granted", "submit_started", "submit_ran", "submit_released")


def cli_argv() -> list[str]:
    """The installed `gpupool` console script beside this Python (what a user runs), else the module."""
    script = Path(sys.executable).parent / "gpupool"
    return [str(script)] if script.exists() else [sys.executable, "-m", "libs.cli.main"]


async def timed_process(argv: list[str], env: dict[str, str]) -> tuple[float, float, int, str]:
    t0 = time.monotonic()
    proc = await asyncio.create_subprocess_exec(*argv, env=env, stdout=asyncio.subprocess.DEVNULL,
                                                stderr=asyncio.subprocess.PIPE)
    _, err = await proc.communicate()
    return t0, time.monotonic(), proc.returncode or 0, err.decode(errors="replace")


async def cli_cycles(run: dict, token: str, events: Events, n: int, startup: int) -> dict:
    """`gpupool run --team T -- true` `n` times, one after another, and its start-up alone `startup` times."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPOOL_")}
    env.update(GPUPOOL_URL=run["gateway_url"], GPUPOOL_TOKEN=token)
    argv = [*cli_argv(), "run", "--team", TEAM, "--", "true"]
    jobs: list[dict[str, float]] = []
    failures: list[str] = []
    for i in range(WARMUP + n):
        t0, t1, rc, err = await timed_process(argv, env)
        job_id = cli_job_id(err)
        if rc != 0 or job_id is None:
            failures.append(f"exit {rc}: {err.strip()[-300:]}")
            continue
        await events.wait(lambda j=job_id: "released" in events.marks.get(j, {}), 10.0)
        marks = events.job(job_id, spawn=t0, exit=t1)
        if i >= WARMUP:
            jobs.append({name: marks[b] - marks[a] for name, a, b in (
                ("wall", "spawn", "exit"), ("spawn_started", "spawn", "started"),
                ("spawn_released", "spawn", "released"), ("released_exit", "released", "exit"))
                if a in marks and b in marks})
    out = summarize_spans(jobs, ("wall", "spawn_started", "spawn_released", "released_exit"))
    walls = []
    for _ in range(startup):
        t0, t1, rc, _err = await timed_process([*cli_argv(), "run", "--help"], env)
        if rc == 0:
            walls.append(t1 - t0)
    return {**out, "startup": summarize(walls), "argv": shlex.join(["gpupool", *argv[-5:]]),
            "failures": len(failures), "failure_examples": failures[:3]}


async def paced(run: dict, token: str, events: Events, rate: float, seconds: float) -> dict:
    """`["true"]` jobs open-loop at `rate`/s for `seconds`; each timed until its process started and its GPUs
    were freed (waiting for the stragglers up to twice the phase, at least 30 s)."""
    from libs.bench.loadgen import Client

    n = max(1, int(rate * seconds))
    api = Client(run["gateway_url"], token, size=32)
    submitted: dict[str, float] = {}
    errors: list[str] = []
    todo = list(range(n))[::-1]
    cpu0 = cpu_times()
    begin = time.monotonic()

    async def submitter() -> None:
        while todo:
            i = todo.pop()
            await asyncio.sleep(max(0.0, begin + i / rate - time.monotonic()))
            t0 = time.monotonic()
            try:
                status, body = await api.call("POST", "/v1/jobs", job_body(f"paced-{rate:g}-{i}"))
            except Exception as exc:  # a dropped connection: counted, the phase goes on
                errors.append(f"{type(exc).__name__}: {exc}")
                continue
            if status in (200, 201):
                submitted[body["job_id"]] = t0
            else:
                errors.append(f"{status}: {body}")

    await asyncio.gather(*(submitter() for _ in range(32)))
    submit_s = time.monotonic() - begin
    await api.close()
    drain = max(30.0, 2 * seconds)
    await events.wait(lambda: all("released" in events.marks.get(j, {}) for j in submitted), drain)
    busy = busy_pct(cpu0, cpu_times())
    # under load an agent's `work_started` can reach NATS after its `work_exited`: give those a moment
    await events.wait(lambda: all("started" in events.marks.get(j, {}) for j in submitted), 5.0)
    jobs = [spans(events.job(j, submit=t)) for j, t in submitted.items()]
    starts = [events.marks[j]["started"] for j in submitted if "started" in events.marks.get(j, {})]
    return {"offered": n, "submitted": len(submitted), "errors": len(errors), "error_examples": errors[:3],
            "submitted_per_s": len(submitted) / submit_s if submit_s > 0 else float("nan"),
            "started": len(starts), "started_per_s": len(starts) / (max(starts) - begin) if starts else 0.0,
            "steady_per_s": (len(starts) - 1) / (max(starts) - min(starts)) if len(starts) > 1 else float("nan"),
            "released": sum(1 for j in submitted if j in events.released),
            "started_after_exit": sum(1 for j in submitted if (m := events.marks.get(j, {})).get("started", 0.0)
                                      > m.get("exited", float("inf"))),
            "completed": sum(1 for j in submitted if events.released.get(j, "").startswith("WorkCompleted")),
            "release_reasons": dict(Counter(events.released[j] for j in submitted if j in events.released)),
            "busy_pct": busy, "drain_s": drain, **summarize_spans(jobs, PACED_SPANS)}


def gpupool_run(args: argparse.Namespace, rates: list[float], label: str) -> dict:
    """One run on a fresh platform: the sequential cycles (HTTP, then the CLI) and the paced phases."""
    with tempfile.TemporaryDirectory(prefix="gpupool-bench-run-") as tmp, \
            Platform(Path(tmp), fleet=args.fleet) as platform:
        token = api_token(platform.run)

        async def go() -> dict:
            events = Events()
            await events.start(platform.run["nats_url"])
            try:
                say(f"{label}: {args.cycles} jobs one at a time over HTTP")
                out: dict = {"cycle": await http_cycles(platform.run, token, events, args.cycles)}
                say(f"{label}: {args.cycles} x gpupool run -- true")
                out["cli"] = await cli_cycles(platform.run, token, events, args.cycles, args.startup)
                out["paced"] = {}
                for rate in rates:
                    say(f"{label}: {rate:g} jobs/s for {args.seconds:g} s")
                    out["paced"][f"{rate:g}"] = await paced(platform.run, token, events, rate, args.seconds)
                return out
            finally:
                await events.close()

        return asyncio.run(go())


def say(text: str) -> None:
    print(f"[bench run] {text}", flush=True)


# --- Slurm peer -------------------------------------------------------------------------------------------------
class SlurmPeer:
    """The emulated cluster of ../shared/peers/slurm: set up with `setup.sh fast`, measured with its bench.py's
    own functions (imported from the peer, not copied), stopped with `stop.sh` if this command started it."""

    def __init__(self, peer: Path) -> None:
        self.peer = peer
        self.base = Path(os.environ.get("SLURM_PEER_BASE", "/var/lib/slurm-peer"))
        self.started_here = False
        self.bench: ModuleType | None = None
        self.note = ""

    def running(self) -> bool:
        """Whether a slurmctld of the peer's is alive (its PID file, as bench.sh checks)."""
        with contextlib.suppress(OSError, ValueError):
            pid = int((self.base / "run" / "slurmctld.pid").read_text().strip())
            return Path(f"/proc/{pid}/comm").read_text().strip() == "slurmctld"
        return False

    def start(self) -> bool:
        setup, bench = self.peer / "setup.sh", self.peer / "bench.py"
        if not setup.exists() or not bench.exists():
            self.note = f"Slurm skipped: no Slurm peer at {self.peer} (setup.sh and bench.py expected)."
            return False
        was_running = self.running()
        say(f"Slurm: {setup} fast")
        done = subprocess.run(["bash", str(setup), "fast"], capture_output=True, text=True, timeout=1200)
        if done.returncode != 0:
            tail = " ".join((done.stdout + done.stderr).strip().splitlines()[-3:])[-400:]
            self.note = f"Slurm skipped: `setup.sh fast` failed (exit {done.returncode}): {tail}"
            return False
        self.started_here = not was_running
        spec = importlib.util.spec_from_file_location("slurm_peer_bench", bench)
        assert spec is not None and spec.loader is not None
        self.bench = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(self.bench)
        self.info = (self.base / "run" / "cluster.info").read_text().split()
        return True

    def stop(self) -> None:
        if self.started_here:
            say("Slurm: stop.sh (this command started it)")
            subprocess.run(["bash", str(self.peer / "stop.sh")], capture_output=True, timeout=300)

    def measure(self, cycles: int, rates: list[float], seconds: float, label: str) -> dict:
        assert self.bench is not None
        with tempfile.TemporaryDirectory(prefix="slurm-bench-run-") as work:
            say(f"{label}: {cycles} sequential srun true")
            self.bench.srun_phase(work, WARMUP)
            srun = self.bench.srun_phase(work, cycles)
            out: dict = {"srun": {**srun["wall"], "failures": srun["calls"] - srun["ok"]}, "paced": {}}
            for rate in rates:
                say(f"{label}: sbatch at {rate:g} jobs/s for {seconds:g} s")
                out["paced"][f"{rate:g}"] = self.paced(work, rate, seconds)
        return out

    def paced(self, work: str, rate: float, seconds: float) -> dict:
        """bench.py's paced batch phase (its script records its own start time), re-read from the per-job
        records it writes so that submit is the moment before `sbatch`, as for gpupool; GPUs free from
        slurmctld's `_job_complete: JobId=N done`."""
        assert self.bench is not None
        n = max(1, int(rate * seconds))
        name = f"paced{rate:g}".replace(".", "_")
        offset = self.bench.log_offset()
        cpu0 = cpu_times()
        phase = self.bench.batch_phase(name, work, n, ["--gres=gpu:1"], max(4, int(rate / 5)), pace=rate)
        busy = busy_pct(cpu0, cpu_times())
        rows = json.loads((Path(work) / name / "jobs.json").read_text())
        done = self.completions(offset)
        return {"offered": n, "submitted": phase["submitted_ok"], "started": phase["started"],
                "submitted_per_s": phase["submit_jobs_per_s"], "started_per_s": phase["start_jobs_per_s"],
                "steady_per_s": phase["start_jobs_per_s_steady"],
                "busy_pct": busy,
                "submit_started": summarize([r["t_start"] - r["t_sbatch"] for r in rows]),
                "submit_released": summarize([done[r["jobid"]] - r["t_sbatch"] for r in rows if r["jobid"] in done]),
                "sbatch_wall": summarize([r["t_ack"] - r["t_sbatch"] for r in rows]),
                "ctld_alloc": summarize([r["t_alloc"] - r["t_ctld_submit"] for r in rows
                                         if "t_alloc" in r and "t_ctld_submit" in r])}

    def completions(self, offset: int) -> dict[str, float]:
        """job id → when slurmctld logged it done (its resources freed), from the peer's log after `offset`."""
        assert self.bench is not None
        done: dict[str, float] = {}
        pattern = re.compile(r"_job_complete: JobId=(\d+) done")
        with open(self.bench.CTLD_LOG, "rb") as f:
            f.seek(offset)
            for raw in f:
                m = self.bench.LOG_RE.match(raw.decode("utf-8", "replace"))
                c = pattern.search(m.group(2)) if m else None
                if m and c:
                    done.setdefault(c.group(1), dt.datetime.strptime(m.group(1), "%Y-%m-%dT%H:%M:%S.%f").timestamp())
        return done


# --- the report -------------------------------------------------------------------------------------------------
# (label, path into a run, what the number includes)
SEQUENTIAL = (
    ("`gpupool run -- true`: the CLI's wall time", ("gpupool", "cli", "wall"),
     "what a user waits: Python start-up and the CLI's imports, the submit, the CLI's state polls (after 50 ms, "
     "then up to 0.5 s apart) and its two log streams to their end"),
    ("… its start-up alone (`gpupool run --help`, measured apart)", ("gpupool", "cli", "startup"),
     "interpreter, the CLI's imports, argument parsing, exit; no request"),
    ("… CLI spawned → process started", ("gpupool", "cli", "spawn_started"), "start-up + submit + the platform"),
    ("… CLI spawned → GPUs free", ("gpupool", "cli", "spawn_released"), "the same, to `allocation.released`"),
    ("… GPUs free → CLI exited", ("gpupool", "cli", "released_exit"),
     "the CLI noticing the end: the gateway's next read of the log streams (50 ms after output, then up to "
     "0.5 s apart), the CLI's next state poll, interpreter exit"),
    ("over HTTP: submit → granted", ("gpupool", "cycle", "submit_granted"),
     "gateway → queue → quota's admission → placement's cycle → `allocation.granted`"),
    ("granted → `agent.work_started`", ("gpupool", "cycle", "granted_started"),
     "the agent takes the grant; the executor makes the job's cgroup, writes the attempt's plan and has its "
     "fork server fork the shim (its own session), which forks and execs `true` and reports back; then the "
     "agent publishes `agent.work_started`"),
    ("`agent.work_started` → `agent.work_exited`", ("gpupool", "cycle", "started_exited"),
     "the two reports' arrival: `true` ends at once, and the agent publishes the exit only once JetStream has "
     "taken the start"),
    ("`agent.work_exited` → GPUs free", ("gpupool", "cycle", "exited_released"),
     "placement releases the allocation (`allocation.released`, reason `WorkCompleted`)"),
    ("**submit → process started** (`agent.work_started`)", ("gpupool", "cycle", "submit_started"),
     "the first two"),
    ("submit → process started, the executor's own record", ("gpupool", "cycle", "submit_ran"),
     "to the shim's record of the exec (`exit.started_at`, wall clock, carried by `agent.work_exited`)"),
    ("… that record → `agent.work_started` received", ("gpupool", "cycle", "ran_started"),
     "how long after the exec the agent's report arrived"),
    ("process run, the executor's own record", ("gpupool", "cycle", "ran_ended"),
     "`true` from exec to exit as the shim saw it"),
    ("**submit → GPUs free: the full cycle**", ("gpupool", "cycle", "submit_released"),
     "submit → `allocation.released`"),
    ("Slurm: `srun -N1 -n1 --gres=gpu:1 -t 1 true`, wall time", ("slurm", "srun"),
     "srun's own start-up (a C binary), allocation at submit, step launch by slurmd/slurmstepd, `true`, step "
     "teardown; srun returns once the step has ended"),
)


def stat(runs: list[dict], path: tuple[str, ...], key: str) -> float:
    """The median over runs of one statistic (p50, p99, a count) of one measure."""
    return med([v if isinstance(v := dig(run, (*path, key)), int | float) else None for run in runs])


def per_run(runs: list[dict], path: tuple[str, ...]) -> str:
    """One measure of every run: p50 / p99 of a summary, or started / offered of a paced phase."""
    cells = []
    for run in runs:
        s = dig(run, path)
        if isinstance(s, dict) and "offered" in s:
            cells.append(f"{s['started']} of {s['offered']}")
        elif isinstance(s, dict) and s.get("n"):
            cells.append(f"{ms(s['p50'])} / {ms(s['p99'])}")
        else:
            cells.append("–")
    return " | ".join(cells)


def paced_rows(rates: list[float]) -> list[tuple[str, tuple[str, ...]]]:
    rows: list[tuple[str, tuple[str, ...]]] = []
    for rate in rates:
        key = f"{rate:g}"
        rows += [(f"{key}/s gpupool: jobs started", ("gpupool", "paced", key)),
                 (f"{key}/s gpupool: submit → granted", ("gpupool", "paced", key, "submit_granted")),
                 (f"{key}/s gpupool: submit → process started", ("gpupool", "paced", key, "submit_started")),
                 (f"{key}/s gpupool: submit → process started, executor's record",
                  ("gpupool", "paced", key, "submit_ran")),
                 (f"{key}/s gpupool: submit → GPUs free", ("gpupool", "paced", key, "submit_released")),
                 (f"{key}/s Slurm: jobs started", ("slurm", "paced", key)),
                 (f"{key}/s Slurm: `sbatch` command", ("slurm", "paced", key, "sbatch_wall")),
                 (f"{key}/s Slurm: slurmctld submit → allocated", ("slurm", "paced", key, "ctld_alloc")),
                 (f"{key}/s Slurm: submit → batch script started", ("slurm", "paced", key, "submit_started")),
                 (f"{key}/s Slurm: submit → job done in slurmctld", ("slurm", "paced", key, "submit_released"))]
    return rows


def comparisons(runs: list[dict], rates: list[float]) -> list[str]:
    def row(name: str, ours: tuple[str, ...], theirs: tuple[str, ...], key: str) -> str:
        a, b = stat(runs, ours, key), stat(runs, theirs, key)
        return f"| {name} | {ms(a)} | {ms(b)} | {ratio(a, b)} |"

    cli, cycle, srun = ("gpupool", "cli", "wall"), ("gpupool", "cycle", "submit_released"), ("slurm", "srun")
    lines = ["| comparison (medians of the runs) | gpupool | Slurm | ratio |", "| --- | --- | --- | --- |",
             row("a user's command, one job at a time: `gpupool run -- true` vs `srun true`, p50", cli, srun, "p50"),
             row("… p99", cli, srun, "p99"),
             row("the platform's full cycle (HTTP submit → GPUs free) vs `srun true`, p50", cycle, srun, "p50"),
             row("… p99", cycle, srun, "p99")]
    for rate in rates:
        key = f"{rate:g}"
        ours, theirs = ("gpupool", "paced", key, "submit_started"), ("slurm", "paced", key, "submit_started")
        lines += [row(f"at {key} jobs/s: submit → process started (Slurm: batch script started), p50", ours,
                      theirs, "p50"),
                  row("… p99", ours, theirs, "p99"),
                  row(f"at {key} jobs/s: submit → GPUs free (Slurm: job done in slurmctld), p50",
                      ours[:-1] + ("submit_released",), theirs[:-1] + ("submit_released",), "p50")]
    return lines


def count(runs: list[dict], path: tuple[str, ...]) -> float:
    """The median over runs of a number (not a summary) at `path`."""
    return med([v if isinstance(v := dig(run, path), int | float) else None for run in runs])


def paced_row(runs: list[dict], rate: str, name: str, path: tuple[str, ...]) -> str:
    def num(k: str) -> float:
        return count(runs, (*path, k))

    def lat(k: str, q: str) -> str:
        return ms(stat(runs, (*path, k), q))

    return (f"| {rate}/s | {name} | {num('offered'):.0f} | {num('started'):.0f} | {num('steady_per_s'):.1f} | "
            f"{lat('submit_started', 'p50')} | {lat('submit_started', 'p99')} | {lat('submit_ran', 'p50')} | "
            f"{lat('submit_released', 'p50')} | {lat('submit_released', 'p99')} | {num('busy_pct'):.0f}% |")


def paced_table(runs: list[dict], rates: list[float]) -> list[str]:
    lines = ["| rate | system | jobs offered | started | started per s, steady | submit → process started p50 | p99 | "
             "p50 by the executor's record | submit → GPUs free p50 | p99 | machine CPU busy |", "|" + " --- |" * 11]
    for rate in rates:
        key = f"{rate:g}"
        for system, name in (("gpupool", "gpupool"), ("slurm", "Slurm `sbatch`")):
            path = (system, "paced", key)
            if any(dig(run, path) for run in runs):
                lines.append(paced_row(runs, key, name, path))
    return lines


def fleet_gpus(fleet: str) -> tuple[int, int]:
    """(nodes, GPUs) of a `--fleet` string such as H100-80GB*8;H100-80GB*8."""
    nodes = [n for n in fleet.split(";") if n.strip()]
    gpus = sum(int(part.rsplit("*", 1)[1]) if "*" in part else 1 for n in nodes for part in n.split(","))
    return len(nodes), gpus


def setting(result: dict) -> list[str]:
    p = result["params"]
    nodes, gpus = fleet_gpus(p["fleet"])
    slurm = result.get("slurm_peer")
    if slurm:
        how = ("set up by `setup.sh fast` in this command and stopped with its `stop.sh` afterwards"
               if slurm["started_here"] else "already running when the command started (`setup.sh fast` "
               "confirmed or applied the profile) and left running")
        peer = (f"Slurm ({slurm['version']}) is the `../shared/peers/slurm` emulated cluster, profile "
                f"`{slurm['profile']}`, {slurm['nodes']} nodes × {slurm['gpus']} fake GPUs through GRES, {how}; "
                "its runs are interleaved with gpupool's, and its daemons sit idle during gpupool's.")
    else:
        peer = result.get("slurm_note") or "Slurm was not run."
    loads = "; ".join(f"run {i + 1}: " + ", ".join(f"{x:.2f}" for x in run["load"])
                      for i, run in enumerate(result["runs"]))
    idle = ", ".join(f"run {i + 1}: {run.get('busy_before_pct', float('nan')):.0f}%"
                     for i, run in enumerate(result["runs"]))
    note = f" {p['note']}" if p.get("note") else ""
    return [
        f"`{result['command']}` — {p['runs']} run(s), each on a fresh `gpupool up` (own NATS + PostgreSQL, every "
        f"service a process) with {nodes} simulated nodes ({gpus} GPUs) whose agent runs every job's command as a "
        f"real process: the executor's shim, in the job's own cgroup ({result.get('cgroups', 'cgroups unknown')} "
        "here). "
        f"{peer} Machine: {result['machine']}. The machine's CPU busy over 5 s before each run, this command "
        f"idle (other users' load): {idle}. Load average (1, 5, 15 min) at the start: "
        f"{', '.join(f'{x:.2f}' for x in result['load_start'])}; before each run (after a first run, this includes "
        f"the command's own phases): {loads}.{note} The platform's "
        "processes, the benchmark's client, the CLI subprocesses and Slurm's daemons all share these cores: the "
        "numbers are what this machine gives with everything on it, not what a cluster would.", ""]


def paced_reading(runs: list[dict], rates: list[float]) -> list[str]:
    """Where a system started jobs more slowly than they were offered: the latency is then its backlog."""
    out = []
    for rate in rates:
        for system, name in (("gpupool", "gpupool"), ("slurm", "Slurm")):
            got = count(runs, (system, "paced", f"{rate:g}", "steady_per_s"))
            if got == got and got < 0.9 * rate:
                out.append(f"At {rate:g} jobs/s {name} started only {got:.1f} jobs/s (steady): its backlog grew "
                           "through the phase, so its latencies there are mostly the wait in that backlog.")
    return [" ".join(out), ""] if out else []


def reasons(phase: dict) -> str:
    return ", ".join(f"{n} {why}" for why, n in sorted(phase["release_reasons"].items(), key=lambda kv: -kv[1]))


def failures(result: dict, rates: list[float]) -> list[str]:
    out = []
    for i, run in enumerate(result["runs"]):
        g = run["gpupool"]
        for what, n, examples in (("jobs over HTTP", g["cycle"]["failures"], g["cycle"]["failure_examples"]),
                                  ("`gpupool run` calls", g["cli"]["failures"], g["cli"]["failure_examples"])):
            if n:
                out.append(f"- run {i + 1}: {n} {what} failed, e.g. {'; '.join(examples)[:300]}")
        for rate in rates:
            ph = g["paced"][f"{rate:g}"]
            if ph.get("started_after_exit"):
                out.append(f"- run {i + 1}, {rate:g}/s: {ph['started_after_exit']} jobs' `agent.work_started` "
                           "reached the benchmark after their `agent.work_exited`")
            if ph["errors"] or min(ph["completed"], ph["started"]) < ph["offered"]:
                out.append(f"- run {i + 1}, {rate:g}/s: of {ph['offered']} offered, {ph['submitted']} accepted "
                           f"({ph['errors']} errors); by {ph.get('drain_s', 0):g} s after the last submission "
                           f"{ph['started']} had started, {ph['released']} had freed their GPUs and "
                           f"{ph['completed']} had completed"
                           + (f"; releases: {reasons(ph)}" if ph.get("release_reasons") else ""))
        s = run.get("slurm")
        if s and s["srun"]["failures"]:
            out.append(f"- run {i + 1}: {s['srun']['failures']} `srun` calls failed")
        for rate in rates if s else []:
            ph = s["paced"][f"{rate:g}"]
            if ph["started"] < ph["offered"]:
                out.append(f"- run {i + 1}, Slurm {rate:g}/s: {ph['started']} of {ph['offered']} batch jobs started")
    return ["Shortfalls:", "", *out, ""] if out else ["Every job of every phase started and freed its GPUs.", ""]


def reading(runs: list[dict]) -> list[str]:
    """What the sequential numbers add up to, in words, from this command's medians."""
    p50 = lambda *path: ms(stat(runs, path, "p50"))  # noqa: E731
    text = (f"Of `gpupool run -- true`'s {p50('gpupool', 'cli', 'wall')} (p50) the platform's own cycle, HTTP submit "
            f"→ GPUs free, is {p50('gpupool', 'cycle', 'submit_released')}; the rest is the CLI: its start-up "
            f"before the request ({p50('gpupool', 'cli', 'startup')} measured apart), and "
            f"{p50('gpupool', 'cli', 'released_exit')} from GPUs free to its exit (the log streams closing at the "
            "gateway's next read, the CLI's next state poll, the interpreter's exit).")
    if any(run.get("slurm") for run in runs):
        text += (f" `srun true` ({p50('slurm', 'srun')}) pays its own start-up too, but it is a C binary and waits "
                 "on the step's completion message instead of polling.")
    return [text, ""]


INCLUDES = (
    "gpupool's times are the benchmark's monotonic clock when NATS delivered each event to it (JetStream publishes "
    "reach a core subscriber like any message); submit is the moment before the HTTP request (keep-alive "
    "connection, a member API token of team research, as the CLI uses).",
    "granted → `agent.work_started` includes the executor's shim start: a shim per attempt, forked by the "
    "executor's fork server (one `python -S` per node), the job's cgroup, fork and exec, and the agent's report; "
    "`agent.work_exited` follows the shim's wait for an empty cgroup and its status file. The executor's own "
    "record (`exit.started_at`, `exit.exited_at`) is the shim's wall clock, mapped onto the benchmark's clock.",
    "`gpupool run` polls the job's state 50 ms after the submit, then half as long again each time up to 0.5 s "
    "(to see it start and to see it end), and follows both log streams until the job has ended (the gateway "
    "reads the agent 50 ms after new output, then up to 0.5 s apart); its wall time includes the interpreter's "
    "start-up and exit.",
    "Slurm's batch numbers are wall-clock times (`time.time()` before `sbatch`, the script's `$EPOCHREALTIME`, "
    "slurmctld's log at ms resolution), all on this machine's one clock; `srun` is timed around the command.",
    f"Before each sequential series {WARMUP} jobs (and {WARMUP} `srun` calls) are run and not counted.",
    "gpupool's agent (every simulated node), its services, PostgreSQL, NATS, the benchmark, the CLI subprocesses and "
    "Slurm's daemons share the machine's cores; a phase's CPU-busy column is the whole machine's, other users "
    "included.",
)


def markdown(result: dict) -> str:
    p, runs = result["params"], result["runs"]
    rates = [float(r) for r in p["rates"]]
    lines = [BEGIN, "## `gpupool run -- true`: a command's whole cycle, beside Slurm's `srun true` and `sbatch`", "",
             *setting(result),
             "### One job at a time: submit → process started → exited → GPUs free", "",
             f"{p['cycles']} jobs per run (after {WARMUP} not counted), each submitted once the last one's GPUs are "
             "free. The platform's phases are timed from the job's events as NATS delivers them to the benchmark "
             "(a core subscription to `gpupool.agent.>` and `gpupool.allocation.>`; each time includes that hop and "
             f"this process's own scheduling). The CLI's start-up: {p['startup']} calls per run. Medians of the "
             "runs' percentiles.", "",
             "| measure | p50 | p99 | what it includes |", "| --- | --- | --- | --- |"]
    for label, path, includes in SEQUENTIAL:
        if any(dig(run, path) for run in runs):
            lines.append(f"| {label} | {ms(stat(runs, path, 'p50'))} | {ms(stat(runs, path, 'p99'))} | {includes} |")
    lines += ["", f"### Paced: `true` jobs at {', '.join(f'{r:g}' for r in rates)} jobs/s for {p['seconds']:g} s",
              "", "gpupool: one-GPU jobs with `command: [\"true\"]` submitted open-loop over HTTP (a keep-alive "
              "client, 32 submitters holding the pace); submit is the moment before the request, process started "
              "is `agent.work_started`, GPUs free is `allocation.released`. Slurm: the peer's bench.py paced phase, "
              "`sbatch --gres=gpu:1 -t 2 -o /dev/null` of a batch script that writes `$EPOCHREALTIME` and exits "
              "(`sbatch --wrap true` with a time stamp); submit is the moment before `sbatch` runs (its start-up "
              "and RPC included, as gpupool's HTTP request is), started is the script's own time stamp, GPUs free "
              "is slurmctld's `_job_complete: JobId=N done` log line (ms resolution). Started per s, steady: "
              "(jobs started − 1) ÷ (last start − first start), bench.py's steady rate. Jobs that had not started "
              "by the end of the drain (twice the phase, at least 30 s, after the last submission) are not in the "
              "percentiles (see the shortfalls below). CPU busy: the whole machine's, from /proc/stat, over the "
              "phase and its drain.", "",
              *paced_table(runs, rates), "", *paced_reading(runs, rates)]
    if any(run.get("slurm") for run in runs):
        lines += ["### Side by side (this command, this machine)", "", *comparisons(runs, rates), ""]
    lines += [*reading(runs), "What the numbers include:", "", *(f"- {x}" for x in INCLUDES), ""]
    lines += ["### Every run (p50 / p99)", "",
              "| measure | " + " | ".join(f"run {i + 1}" for i in range(len(runs))) + " |",
              "|" + " --- |" * (len(runs) + 1)]
    for label, path in [(label, path) for label, path, _ in SEQUENTIAL] + paced_rows(rates):
        if any(dig(run, path) for run in runs):
            lines.append(f"| {label} | {per_run(runs, path)} |")
    lines += ["", *failures(result, rates), END]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpupool bench run", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cycles", type=int, default=50, help="sequential jobs per run (HTTP, CLI and srun each)")
    parser.add_argument("--rates", default="10,50", help="paced rates in jobs/s, comma-separated")
    parser.add_argument("--seconds", type=float, default=20.0, help="length of each paced phase")
    parser.add_argument("--runs", "--seeds", dest="runs", type=int, default=2,
                        help="runs, each on a fresh platform (all published; medians reported)")
    parser.add_argument("--startup", type=int, default=10, help="`gpupool run --help` calls per run (start-up)")
    parser.add_argument("--fleet", default=FLEET, help="simulated nodes (gpupool up --fleet)")
    parser.add_argument("--slurm", action="store_true", help="also measure the Slurm peer in the same command")
    parser.add_argument("--slurm-peer", type=Path, default=SLURM_PEER,
                        help="the Slurm peer's folder (setup.sh, bench.py, stop.sh); default ../shared/peers/slurm")
    parser.add_argument("--note", default="", help="a sentence on the machine's state, put beside the load")
    parser.add_argument("--out", type=Path, default=Path("docs/benchmarks.md"),
                        help="markdown file whose run-benchmark section is (re)written")
    parser.add_argument("--json", type=Path, default=None, help="also write the raw results here")
    args = parser.parse_args(argv)
    rates = [float(x) for x in args.rates.split(",") if x.strip()]
    command = "gpupool bench run " + shlex.join(argv if argv is not None else sys.argv[1:])
    result: dict = {"command": command.strip(), "machine": benchdoc.machine(), "cgroups": cgroup_kind(),
                    "load_start": list(os.getloadavg()),
                    "params": {"cycles": args.cycles, "rates": rates, "seconds": args.seconds, "runs": args.runs,
                               "startup": args.startup, "fleet": args.fleet, "note": args.note}, "runs": []}
    slurm = SlurmPeer(args.slurm_peer) if args.slurm else None
    ready = slurm.start() if slurm else False
    if slurm and not ready:
        say(slurm.note)
    try:
        for r in range(args.runs):
            run: dict = {"load": list(os.getloadavg()), "busy_before_pct": idle_busy(5.0)}
            run["gpupool"] = gpupool_run(args, rates, f"run {r + 1}/{args.runs}")
            if slurm and ready:
                run["slurm"] = slurm.measure(args.cycles, rates, args.seconds, f"run {r + 1}/{args.runs} Slurm")
            result["runs"].append(run)
    finally:
        if slurm and ready:
            slurm.stop()
    if slurm and ready:
        version = subprocess.run(["sinfo", "-V"], capture_output=True, text=True).stdout.strip()
        result["slurm_peer"] = {"version": version or "unknown version", "nodes": slurm.info[0],
                                "gpus": slurm.info[1], "profile": slurm.info[2], "started_here": slurm.started_here}
    result["slurm_note"] = slurm.note if slurm else "Slurm was not run (no `--slurm`)."
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    benchdoc.write_section(args.out, BEGIN, END, markdown(result))
    print(markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
