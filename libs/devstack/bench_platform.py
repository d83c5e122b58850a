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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpupool bench platform", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--burst", type=int, default=2000, help="jobs in the burst phase")
    parser.add_argument("--paced", type=int, default=100, help="jobs in the paced phase")
    parser.add_argument("--rate", type=float, default=10.0, help="paced submissions per second")
    parser.add_argument("--clients", type=int, default=4, help="concurrent submitters in the burst")
    parser.add_argument("--out", type=Path, default=Path("docs/bench-platform.json"))
    args = parser.parse_args(argv)
    result = run_benchmark(args.runs, args.burst, args.paced, args.rate, args.clients)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result["median"], indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
