"""Deep-backlog benchmark: how quickly a freed GPU gets its next job when thousands of jobs wait.

A real `gpupool up` (own NATS + PostgreSQL, every service a process) on 8 simulated nodes × 8 GPUs. For each
backlog depth D, on a fresh platform: submit 64 + D one-GPU jobs through the HTTP API (64 start, D wait), let the
backlog settle, then complete running jobs one at a time and time each completion until the next job has started
(`job.started` seen on NATS). Every scheduling cycle looks at the whole backlog, so this is where a cycle's cost per
waiting job shows; the shallowest depth, run in the same command, is the baseline the deeper ones are compared with.
CPU seconds of every process are read from /proc around the turnover phase, and placement's own cycle histogram
(`gpupool_scheduling_cycle_seconds`) gives the cycles run and their mean length.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
import urllib.request
from collections import defaultdict
from pathlib import Path

import nats

from libs.bench import benchdoc
from libs.bench.e2e import Platform, ProcessMeter, pct

BEGIN, END = "<!-- backlog-benchmark:begin -->", "<!-- backlog-benchmark:end -->"
GPUS_PER_NODE = 8
SETTLE_S = 600  # the longest wait for the consumers to take in the fill before the turnovers


def cycle_counters(run: dict) -> dict[str, float]:
    """Cycles run ("cycles"), seconds spent in them ("total") and in each part of them (load, build, core, store)
    from placement's metrics."""
    return cycle_sums(urllib.request.urlopen(run["metrics"]["placement"], timeout=10).read().decode())


def cycle_sums(text: str) -> dict[str, float]:
    sums: dict[str, float] = defaultdict(float)
    for line in text.splitlines():
        name, _, value = line.rpartition(" ")
        if name.startswith("gpupool_scheduling_cycle_seconds_count"):
            sums["cycles"] += float(value)
        elif name.startswith("gpupool_scheduling_cycle_seconds_sum"):
            sums["total"] += float(value)
        elif name.startswith('gpupool_scheduling_cycle_part_seconds_sum{part="'):
            sums[name.split('"')[1]] += float(value)
    return dict(sums)


async def measure(run: dict, depth: int, turnovers: int, clients: int, gpus: int) -> dict:
    from libs.bench.loadgen import Client

    nc = await nats.connect(servers=run["nats_url"].split(","))
    started: dict[str, float] = {}
    order: list[str] = []
    changed = asyncio.Event()

    async def on_started(msg) -> None:  # type: ignore[no-untyped-def]
        job_id = json.loads(msg.data)["data"]["job_id"]
        if job_id not in started:
            started[job_id] = time.monotonic()
            order.append(job_id)
            changed.set()

    await nc.subscribe("gpupool.job.started", cb=on_started)
    await nc.flush()

    # every GPU's first job starts: at fleet size that is thousands of grants and starts on a shared machine
    # (at 1,024 nodes on 2 cores the first 8,192 starts took ~1,100 s behind 100 waiting jobs: give it time)
    allowed_s = 300 + gpus / 4
    t0 = time.monotonic()
    await _fill(run, gpus + depth, clients, full_until=t0 + allowed_s)
    submit_s = time.monotonic() - t0
    deadline = time.monotonic() + allowed_s
    while len(started) < gpus:
        if time.monotonic() > deadline:
            why = await _not_started(run, clients, set(started))
            raise RuntimeError(f"only {len(started)} of {gpus} jobs started within {allowed_s:.0f} s; {why}")
        await asyncio.sleep(0.1)
    await asyncio.sleep(3.0)  # the cycles that met the whole backlog have run
    settle_s, unsettled = await settle(nc, deadline=time.monotonic() + SETTLE_S)

    meter = ProcessMeter(run)
    api = Client(run["gateway_url"], run["admin_token"], size=2)
    sums_before = cycle_counters(run)
    before = meter.sample()
    latencies: list[float] = []
    began_at: list[float] = []  # each turnover's start, seconds into the phase
    running = list(order)
    t1 = time.monotonic()
    for _ in range(turnovers):
        job_id = running.pop(0)
        seen = len(order)
        began = time.monotonic()
        status, body = await api.call("POST", f"/v1/jobs/{job_id}/complete")
        if status != 200:
            raise RuntimeError(f"complete {job_id}: {status} {body}")
        while len(order) == seen:  # on_started sets `changed` after appending; clear it before each look
            changed.clear()
            if len(order) == seen:
                try:
                    await asyncio.wait_for(changed.wait(), timeout=max(0.0, began + 60 - time.monotonic()))
                except TimeoutError:
                    raise RuntimeError(f"no job started within 60 s of completing {job_id} (backlog {depth})") from None
        latencies.append(started[order[seen]] - began)
        began_at.append(began - t1)
        running += order[seen:]
    wall = time.monotonic() - t1
    after = meter.sample()
    sums_after = cycle_counters(run)
    await api.close()
    await nc.close()
    spent = {k: v - sums_before.get(k, 0.0) for k, v in sums_after.items()}
    cycles = spent.get("cycles", 0)
    cpu = {name: round((after[name][0] - before[name][0]) * 1000 / turnovers, 1) for name in after if name in before}
    return {"depth": depth, "turnovers": turnovers, "submit_per_s": round((gpus + depth) / submit_s, 1),
            "next_start_p50_ms": round(pct(latencies, 50) * 1000, 1),
            "next_start_p90_ms": round(pct(latencies, 90) * 1000, 1),
            "next_start_max_ms": round(max(latencies) * 1000, 1),
            "turnovers_per_s": round(turnovers / wall, 2),
            "cycles_per_turnover": round(cycles / turnovers, 2),
            "cycle_mean_ms": round(spent["total"] * 1000 / cycles, 1) if cycles else None,
            "cycle_parts_mean_ms": {k: round(v * 1000 / cycles, 1) for k, v in spent.items()
                                    if k not in ("cycles", "total")} if cycles else {},
            "cpu_ms_per_turnover": cpu, "settle_s": round(settle_s, 1), "unsettled_events": unsettled,
            "next_start_ms": [round(x * 1000, 1) for x in latencies],  # every turnover, in order
            "turnover_at_s": [round(x, 2) for x in began_at]}


async def settle(nc, deadline: float) -> tuple[float, int]:  # type: ignore[no-untyped-def]
    """Wait until every durable consumer has taken in what the fill published (no message pending or unacknowledged,
    twice in a row), so turnovers are measured on a platform at rest, not beside the fill's thousands of grants still
    being accounted and tracked. (seconds waited, messages still pending at the deadline: 0 when it settled)"""
    js, began, quiet = nc.jetstream(), time.monotonic(), 0
    while True:
        pending = 0
        for stream in await js.streams_info():
            for consumer in await js.consumers_info(stream.config.name):
                pending += consumer.num_pending + consumer.num_ack_pending
        quiet = quiet + 1 if pending == 0 else 0
        if quiet >= 2 or time.monotonic() > deadline:
            return time.monotonic() - began, pending
        await asyncio.sleep(1.0)


async def _fill(run: dict, jobs: int, clients: int, full_until: float) -> None:
    """Submit `jobs` one-GPU jobs over HTTP from `clients` concurrent submitters. The queue admits more only as
    jobs start: a 429 is waited out as Retry-After says (as users' tools do) until `full_until` (a depth above its
    max backlog, or nothing starting: the run cannot fill, and says so)."""
    from libs.bench.loadgen import Client, HttpError

    api = Client(run["gateway_url"], run["admin_token"], size=clients * 2)
    todo = list(range(jobs))
    errors: list[str] = []

    async def submitter() -> None:
        while todo:
            i = todo.pop()
            cut = 0
            while True:
                try:  # (the same Idempotency-Key: a submission sent again is never a second job)
                    status, body = await api.call("POST", "/v1/jobs", {"name": f"backlog-{i}", "team": "research",
                                                                       "gpus": 1}, {"Idempotency-Key": f"b-{i}"})
                except (HttpError, OSError):  # a kept-alive connection the gateway closed or reset meanwhile (each
                    cut += 1  # of the pool's may be: each is replaced by a fresh one)
                    if cut > 4 * clients + 5:
                        raise
                    continue
                cut = 0  # (only failures in a row count: a long wait for room meets many closed connections)
                if status != 429:
                    break
                if time.monotonic() > full_until:
                    raise RuntimeError(f"the queue stayed full (429) past the fill's deadline: is the depth above its "
                                       f"max backlog? {body}")
                await asyncio.sleep(min(float(body.get("retry_after_s") or 1), 5.0) if isinstance(body, dict) else 1)
            if status not in (200, 201):  # 200: a submission replayed (same key) after a lost reply
                errors.append(f"{status}: {body}")

    try:
        await asyncio.gather(*(submitter() for _ in range(clients)))
    finally:
        await api.close()
    if errors:
        raise RuntimeError(f"{len(errors)} submissions failed, e.g. {errors[:3]}")


async def _not_started(run: dict, clients: int, started: set[str]) -> str:
    """What the platform says of the jobs whose start was never seen (a few of them): their state and, for those
    not running, why (`explain`), so a run that fails says where a job stopped."""
    from libs.bench.loadgen import Client

    api = Client(run["gateway_url"], run["admin_token"], size=2)
    try:
        states: dict[str, list[str]] = {}
        after = None
        while True:
            status, body = await api.call("GET", "/v1/jobs?limit=1000" + (f"&cursor={after}" if after else ""))
            if status != 200:
                return f"listing jobs: {status} {body}"
            for job in body.get("items", []):
                if job["job_id"] not in started:
                    states.setdefault(job.get("state", "?"), []).append(job["job_id"])
            after = body.get("next")
            if not after:
                break
        out = [f"{state}: {len(ids)} ({', '.join(ids[:5])})" for state, ids in sorted(states.items())]
        for job_id in [i for state, ids in states.items() if state not in ("running",) for i in ids][:3]:
            status, body = await api.call("GET", f"/v1/jobs/{job_id}/explain")
            out.append(f"explain {job_id}: {json.dumps(body)[:600]}")
        return "jobs never seen starting, by state: " + "; ".join(out)
    except Exception as e:  # noqa: BLE001 (a diagnosis must not hide the failure it diagnoses)
        return f"no diagnosis: {e!r}"
    finally:
        await api.close()


def run_benchmark(depths: list[int], turnovers: int, clients: int, nodes: int,
                  telemetry_s: float = 2.0) -> list[dict]:
    rows = []
    gpus = nodes * GPUS_PER_NODE
    fleet = ";".join([f"H100-80GB*{GPUS_PER_NODE}"] * nodes)
    for depth in depths:
        with (tempfile.TemporaryDirectory(prefix="gpupool-backlog-") as tmp,
              Platform(Path(tmp), fleet, ("--telemetry-interval", str(telemetry_s))) as platform):
            print(f"[bench] backlog {depth}: {gpus + depth} jobs, then {turnovers} turnovers", flush=True)
            rows.append(asyncio.run(measure(platform.run, depth, turnovers, clients, gpus))
                        | {"nodes": nodes, "telemetry_s": telemetry_s})
            print(f"[bench] backlog {depth}: {json.dumps(rows[-1])}", flush=True)
    return rows


def markdown(rows: list[dict], command: str) -> str:
    base = rows[0]
    nodes = base.get("nodes", 8)
    gpus = nodes * GPUS_PER_NODE
    lines = [
        BEGIN,
        "## Deep backlog: a freed GPU's next job with thousands waiting",
        "",
        f"`{command}` — a real `gpupool up` on {nodes} simulated nodes × {GPUS_PER_NODE} GPUs per depth; {gpus} + "
        f"depth one-GPU jobs submitted over HTTP ({gpus} run, the rest wait); once every bus consumer has taken in "
        f"what the fill published{_settled(rows)}, running jobs are completed one at a "
        "time, each timed until the next job started (`job.started` on NATS); the agent samples every GPU's "
        f"telemetry every {base.get('telemetry_s', 2.0):g} s throughout. Every scheduling cycle considers the "
        f"whole backlog. Machine: {benchdoc.machine()}. The first depth is the baseline of the ratios (same command, "
        "same machine).",
        "",
        "| waiting jobs | complete → next job started p50 | p90 | max | placement CPU ms per turnover | "
        "PostgreSQL CPU ms per turnover | cycles per turnover | mean cycle (its parts, ms) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        cpu = r["cpu_ms_per_turnover"]
        lines.append(f"| {r['depth']} | {r['next_start_p50_ms']:.0f} ms | {r['next_start_p90_ms']:.0f} ms | "
                     f"{r['next_start_max_ms']:.0f} ms | {cpu.get('placement', 0):.1f} | {cpu.get('postgres', 0):.1f} | "
                     f"{r['cycles_per_turnover']:.2f} | "
                     f"{_cycle_cell(r)} |")
    for r in rows:
        if r.get("next_start_ms"):
            lines += ["", f"Every turnover at {r['depth']} waiting, in order (ms): "
                      + ", ".join(f"{x:.0f}" for x in r["next_start_ms"]) + "."]
    if len(rows) > 1:
        deep = rows[-1]
        ratio = deep["depth"] / max(base["depth"], 1)
        lines += ["", f"From {base['depth']} to {deep['depth']} waiting jobs ({ratio:g}x as many): the next job starts "
                  f"{deep['next_start_p50_ms'] / max(base['next_start_p50_ms'], 0.1):.1f}x later at the median, "
                  f"and placement spends {_ratio(deep, base, 'placement')} the CPU per turnover."]
    lines += ["", "What a cycle does with a deep backlog: it reads only the wanted jobs whose rows changed since its "
              "last read (`pending_jobs.changed_xid` against the previous read's snapshot xmin; placement keeps the "
              "rest in memory), reuses the schedulable units and the core's normalised requests of unchanged jobs, "
              "and still orders and considers every waiting job (the core's `schedule` is one pass over them with "
              "per-shape memos) and records the cycle's input for replay (as a delta against a keyframe).", END]
    return "\n".join(lines)


def _settled(rows: list[dict]) -> str:
    waited = [r["settle_s"] for r in rows if "settle_s" in r]
    if not waited:
        return ""
    unsettled = [f"{r['unsettled_events']} at depth {r['depth']}" for r in rows if r.get("unsettled_events")]
    return f" (up to {max(waited):.0f} s" + (f"; still pending at the deadline: {', '.join(unsettled)}" if unsettled
                                             else "") + ")"


def _cycle_cell(row: dict) -> str:
    """The mean cycle and, where placement reported them, its parts: "120.0 ms (load 8 · core 70 · store 42)"."""
    if row["cycle_mean_ms"] is None:
        return "–"
    parts = row.get("cycle_parts_mean_ms") or {}
    named = " · ".join(f"{k} {parts[k]:.0f}" for k in ("load", "build", "core", "store") if k in parts)
    return f"{row['cycle_mean_ms']:.1f} ms" + (f" ({named})" if named else "")


def _ratio(deep: dict, base: dict, name: str) -> str:
    b = base["cpu_ms_per_turnover"].get(name) or 0
    d = deep["cpu_ms_per_turnover"].get(name) or 0
    return f"{d / b:.1f}x" if b else "n/a"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpupool bench backlog", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--depths", default="100,1000,10000",
                        help="waiting jobs per run, comma-separated; the first is the baseline of the ratios")
    parser.add_argument("--turnovers", type=int, default=30, help="jobs completed one at a time per depth")
    parser.add_argument("--clients", type=int, default=16, help="concurrent submitters while filling the backlog")
    parser.add_argument("--nodes", type=int, default=8, help=f"simulated nodes of {GPUS_PER_NODE} H100s")
    parser.add_argument("--telemetry-interval", type=float, default=2.0,
                        help="seconds between the simulated agent's telemetry samples of every GPU")
    parser.add_argument("--doc", type=Path, default=Path("docs/benchmarks.md"),
                        help="markdown file whose backlog section is (re)written")
    parser.add_argument("--json", type=Path, default=None, help="also write the raw results here")
    args = parser.parse_args(argv)
    depths = [int(x) for x in args.depths.split(",") if x.strip()]
    gpus = args.nodes * GPUS_PER_NODE
    if not depths or min(depths) < 0 or args.nodes < 1 or not 1 <= args.turnovers <= gpus:
        parser.error(f"--depths must be non-negative integers, --nodes at least 1 and --turnovers 1..{gpus}")
    if not 0.1 <= args.telemetry_interval <= 3600:
        parser.error("--telemetry-interval must be within 0.1..3600 seconds")
    rows = run_benchmark(depths, args.turnovers, args.clients, args.nodes, args.telemetry_interval)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")
    command = "gpupool bench backlog " + " ".join(argv if argv is not None else sys.argv[1:])
    benchdoc.write_section(args.doc, BEGIN, END, markdown(rows, command.strip()))
    print(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
