"""End-to-end platform benchmark: a real `gpupool up` (own NATS + PostgreSQL, every service a process) driven
through the HTTP API, measured the way the Slurm peer (../shared/peers/slurm) measures Slurm, so the two can be
compared in one session on one machine.

Phases (each run on a fresh platform; medians over runs):
  paced  P one-GPU jobs submitted open-loop at R jobs/s (never saturated): submit → allocation.granted latency.
  burst  N one-GPU jobs submitted as fast as C concurrent clients can, each job completed the moment it is
         granted (an instant job): jobs started per second and time until all started.
The fleet is 8 simulated nodes × 8 GPUs, like the Slurm peer's emulated cluster.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform as host
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import nats

FLEET = ";".join(["H100-80GB*8"] * 8)


def pct(xs: list[float], p: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    k = (len(xs) - 1) * p / 100.0
    lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


class Platform:
    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir

    def __enter__(self) -> Platform:
        env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPOOL_")}
        self.out = open(self.data_dir / "up.out", "wb")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "libs.cli.main", "up", "--port", "0", "--data-dir", str(self.data_dir),
             "--fleet", FLEET, "--telemetry-interval", "2", "--log-level", "WARNING"],
            env=env, stdout=self.out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 120
        while not (self.data_dir / "run.json").exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError((self.data_dir / "up.out").read_text())
            time.sleep(0.2)
        self.run = json.loads((self.data_dir / "run.json").read_text())
        headers = {"Authorization": f"Bearer {self.run['admin_token']}"}
        with httpx.Client(base_url=self.run["gateway_url"], headers=headers) as api:
            while len(api.get("/v1/nodes").json().get("items", [])) < 8:
                if time.monotonic() > deadline:
                    raise RuntimeError("fleet did not register")
                time.sleep(0.2)
        return self

    def __exit__(self, *exc: object) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.out.close()


async def drive(run: dict, jobs: int, *, rate: float | None, clients: int, complete: bool) -> dict:
    """Submit `jobs` one-GPU jobs (paced at `rate`/s, or as fast as `clients` can) and time each until granted."""
    submitted: dict[str, float] = {}
    granted: dict[str, float] = {}
    done = asyncio.Event()
    headers = {"Authorization": f"Bearer {run['admin_token']}"}
    limits = httpx.Limits(max_connections=clients * 2)
    async with httpx.AsyncClient(base_url=run["gateway_url"], headers=headers, timeout=60, limits=limits) as api:
        nc = await nats.connect(run["nats_url"])
        completions: list[asyncio.Task] = []

        async def on_granted(msg) -> None:  # type: ignore[no-untyped-def]
            doc = json.loads(msg.data)
            job_id = doc["data"]["job_id"]
            granted.setdefault(job_id, time.monotonic())
            if complete:
                completions.append(asyncio.create_task(finish(job_id)))
            if len(granted) >= jobs:
                done.set()

        async def finish(job_id: str) -> None:
            """The grant event can reach us before the queue has marked the job running: retry the 409."""
            for _ in range(200):
                response = await api.post(f"/v1/jobs/{job_id}/complete")
                if response.status_code != 409:
                    return
                await asyncio.sleep(0.02)

        await nc.subscribe("gpupool.allocation.granted", cb=on_granted)
        await nc.flush()
        started = time.monotonic()
        queue: asyncio.Queue[int] = asyncio.Queue()
        for i in range(jobs):
            queue.put_nowait(i)

        async def submitter() -> None:
            while True:
                try:
                    i = queue.get_nowait()
                except asyncio.QueueEmpty:
                    return
                if rate:
                    await asyncio.sleep(max(0.0, started + i / rate - time.monotonic()))
                t0 = time.monotonic()
                response = await api.post("/v1/jobs", json={"name": f"bench-{i}", "team": "research", "gpus": 1})
                response.raise_for_status()
                submitted[response.json()["job_id"]] = t0

        await asyncio.gather(*(submitter() for _ in range(clients if not rate else max(clients, 16))))
        submit_s = time.monotonic() - started
        try:
            await asyncio.wait_for(done.wait(), timeout=120)
        except TimeoutError:
            raise RuntimeError(f"only {len(granted)} of {jobs} jobs were granted "
                               f"({len(submitted)} submitted)") from None
        all_started_s = time.monotonic() - started
        await asyncio.gather(*completions, return_exceptions=True)
        await nc.close()
    latencies = [granted[j] - t for j, t in submitted.items() if j in granted]
    return {"jobs": jobs, "submit_s": submit_s, "all_started_s": all_started_s,
            "started_per_s": jobs / all_started_s, "submitted_per_s": jobs / submit_s,
            "latency_p50_s": pct(latencies, 50), "latency_p99_s": pct(latencies, 99)}


def run_benchmark(runs: int, burst: int, paced: int, rate: float, clients: int) -> dict:
    results: list[dict] = []
    for r in range(runs):
        with tempfile.TemporaryDirectory(prefix="gpupool-bench-") as tmp, Platform(Path(tmp)) as platform:
            print(f"[bench] run {r + 1}/{runs}: paced {paced} jobs at {rate}/s", flush=True)
            paced_result = asyncio.run(drive(platform.run, paced, rate=rate, clients=clients, complete=True))
            print(f"[bench] run {r + 1}/{runs}: burst of {burst} instant jobs, {clients} clients", flush=True)
            burst_result = asyncio.run(drive(platform.run, burst, rate=None, clients=clients, complete=True))
            results.append({"paced": paced_result, "burst": burst_result})
    med = lambda phase, key: statistics.median(r[phase][key] for r in results)  # noqa: E731
    return {
        "runs": results,
        "median": {
            "paced_latency_p50_s": med("paced", "latency_p50_s"),
            "paced_latency_p99_s": med("paced", "latency_p99_s"),
            "burst_started_per_s": med("burst", "started_per_s"),
            "burst_all_started_s": med("burst", "all_started_s"),
            "burst_latency_p50_s": med("burst", "latency_p50_s"),
            "burst_latency_p99_s": med("burst", "latency_p99_s"),
            "burst_submitted_per_s": med("burst", "submitted_per_s"),
        },
        "params": {"runs": runs, "burst": burst, "paced": paced, "rate": rate, "clients": clients,
                   "fleet": "8 nodes x 8 GPUs (simulated)"},
    }


SLURM_BENCH = Path(__file__).resolve().parents[2].parent / "shared" / "peers" / "slurm" / "bench.sh"
BEGIN, END = "<!-- platform-benchmark:begin -->", "<!-- platform-benchmark:end -->"


def run_slurm_peer(burst: int, paced: int, rate: float, clients: int) -> dict | None:
    """The same two phases on the local emulated Slurm cluster (../shared/peers/slurm), parsed from its summary."""
    if not SLURM_BENCH.exists():
        return None
    out = subprocess.run(
        ["bash", str(SLURM_BENCH), "--", "--runs", "1", "-n", str(burst), "-p", str(clients), "--paced", str(paced),
         "--rate", str(rate), "--held", "0", "--gang", "0", "--array", "0", "--srun", "0"],
        capture_output=True, text=True, timeout=1800)
    text = out.stdout + out.stderr
    burst_line = next((line for line in text.splitlines() if line.startswith("burst")), "")
    paced_line = next((line for line in text.splitlines() if line.startswith("paced")), "")
    num = lambda pattern, line: float(m.group(1)) if (m := re.search(pattern, line)) else float("nan")  # noqa: E731
    if not burst_line:
        return None
    return {
        "burst_started_per_s": num(r"all started\s+[\d.]+s =\s+([\d.]+) jobs/s", burst_line),
        "burst_all_started_s": num(r"all started\s+([\d.]+)s", burst_line),
        "burst_start_p50_s": num(r"submit->start p50\s+([\d.]+)s", burst_line),
        "burst_start_p99_s": num(r"submit->start p50\s+[\d.]+s p99\s+([\d.]+)s", burst_line),
        "burst_alloc_p50_s": num(r"submit->alloc p50\s+([\d.]+)s", burst_line),
        "paced_start_p50_s": num(r"submit->start p50\s+([\d.]+)s", paced_line),
        "paced_start_p99_s": num(r"submit->start p50\s+[\d.]+s p99\s+([\d.]+)s", paced_line),
        "paced_alloc_p50_s": num(r"submit->alloc p50\s+([\d.]+)s", paced_line),
        "paced_alloc_p99_s": num(r"submit->alloc p50\s+[\d.]+s p99\s+([\d.]+)s", paced_line),
    }


def markdown(result: dict, slurm: dict | None, command: str) -> str:
    m = result["median"]
    p = result["params"]
    ms = lambda x: f"{1000 * x:.0f} ms"  # noqa: E731
    lines = [
        BEGIN,
        "## End to end through the platform (gateway → queue → quota → placement → allocation event)",
        "",
        f"`{command}` — a real `gpupool up` (own NATS + PostgreSQL, every service its own process) on "
        f"{p['fleet']}, driven over HTTP; submit → `allocation.granted` observed on NATS. Machine: "
        f"{os.cpu_count()} logical CPUs, Python {host.python_version()}, {host.system()} {host.release()}. "
        f"Medians of {p['runs']} run(s).",
        "",
        "| measure | gpupool | Slurm peer (same session) | ratio |",
        "| --- | --- | --- | --- |",
    ]

    def row(name: str, ours: float, theirs: float | None, fmt, better_low: bool = True) -> None:  # type: ignore[no-untyped-def]
        if theirs is None or theirs != theirs:
            lines.append(f"| {name} | {fmt(ours)} | - | - |")
            return
        ratio = theirs / ours if better_low else ours / theirs
        lines.append(f"| {name} | {fmt(ours)} | {fmt(theirs)} | {ratio:.1f}x {'faster' if ratio >= 1 else 'slower'} |")

    s = slurm or {}
    row(f"paced {p['paced']} jobs at {p['rate']:g}/s: submit → granted p50 (Slurm: → allocated)",
        m["paced_latency_p50_s"], s.get("paced_alloc_p50_s"), ms)
    row("paced: p99", m["paced_latency_p99_s"], s.get("paced_alloc_p99_s"), ms)
    row("paced: p50 against Slurm's submit → job running", m["paced_latency_p50_s"], s.get("paced_start_p50_s"), ms)
    row(f"burst of {p['burst']} one-GPU jobs, {p['clients']} clients: jobs started per second",
        m["burst_started_per_s"], s.get("burst_started_per_s"), lambda x: f"{x:.1f}/s", better_low=False)
    row("burst: time until all started", m["burst_all_started_s"], s.get("burst_all_started_s"),
        lambda x: f"{x:.1f} s")
    row("burst: submit → granted p50 (Slurm: → running)", m["burst_latency_p50_s"], s.get("burst_start_p50_s"), ms)
    row("burst: submit → granted p99 (Slurm: → running)", m["burst_latency_p99_s"], s.get("burst_start_p99_s"), ms)
    lines += [
        "",
        "Slurm is the `../shared/peers/slurm` emulated cluster (8 nodes × 8 GPUs, profile as set up), benched in the "
        "same command. Its 'running' includes launching the batch script; its 'allocated' is slurmctld's own "
        "allocation log time, the closer match to gpupool's grant. In gpupool's burst, each job is completed as "
        "soon as it is granted (instant jobs), so the 64 GPUs turn over like Slurm's short jobs. Throughput here "
        "is bounded by the 2-core machine running 8 Python processes, NATS and PostgreSQL at once.",
        END,
    ]
    return "\n".join(lines)


def write_section(path: Path, section: str) -> None:
    text = path.read_text() if path.exists() else "# Benchmarks\n"
    if BEGIN in text and END in text:
        text = text[:text.index(BEGIN)] + section + text[text.index(END) + len(END):]
    else:
        text = text.rstrip() + "\n\n" + section + "\n"
    path.write_text(text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpupool bench platform", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--burst", type=int, default=2000, help="jobs in the burst phase")
    parser.add_argument("--paced", type=int, default=100, help="jobs in the paced phase")
    parser.add_argument("--rate", type=float, default=10.0, help="paced submissions per second")
    parser.add_argument("--clients", type=int, default=4, help="concurrent submitters in the burst")
    parser.add_argument("--slurm", action="store_true",
                        help="also bench the Slurm peer (../shared/peers/slurm, set up by its setup.sh) in the same "
                             "command and report ratios")
    parser.add_argument("--doc", type=Path, default=Path("docs/benchmarks.md"),
                        help="markdown file whose platform section is (re)written")
    parser.add_argument("--json", type=Path, default=None, help="also write the raw results here")
    args = parser.parse_args(argv)
    result = run_benchmark(args.runs, args.burst, args.paced, args.rate, args.clients)
    slurm = run_slurm_peer(args.burst, args.paced, args.rate, args.clients) if args.slurm else None
    result["slurm"] = slurm
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    command = "gpupool bench platform " + " ".join(argv if argv is not None else sys.argv[1:])
    write_section(args.doc, markdown(result, slurm, command.strip()))
    print(json.dumps({"gpupool": result["median"], "slurm": slurm}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
