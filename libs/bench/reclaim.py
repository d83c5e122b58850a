"""GPU-hours recovered by reclamation, measured on a real `gpupool up` with telemetry flowing.

A simulated fleet runs a steady mix in which a third of the jobs are interactive dev sessions that go idle (the
simulated agent keeps their GPUs at ~0% utilization) and the rest train. Reclamation warns each idle session after
its idle window and takes the GPUs back after the grace period. Over the measured window:

  held idle before reclaim   GPU-hours the idle sessions held from their grant to their release;
  recovered                  GPU-hours between each release and the end of the window: capacity that came back
                             to the pool instead of staying held by a session nobody used (without reclamation
                             those sessions would have held their GPUs at least until the window ended);
  recovered share            recovered / (recovered + held idle before reclaim).

The waste report (accounting, from inventory's one-minute rollups) names the idle allocations independently; the
benchmark records how many of the idle sessions it named.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx

from libs.bench import benchdoc
from libs.bench.e2e import Platform

BEGIN, END = "<!-- reclaim-benchmark:begin -->", "<!-- reclaim-benchmark:end -->"


def run(nodes: int, jobs: int, window_s: float, idle_after_s: float, grace_s: float) -> dict:
    fleet = ";".join(["L40S*8"] * nodes)
    extra = ("--env", "agent:SIM_WORKLOADS=dev=idle,training=training,inference=inference,batch=training",
             "--env", "reclamation:SWEEP_INTERVAL_S=1", "--env", "inventory:MAINTENANCE_INTERVAL_S=5")
    with tempfile.TemporaryDirectory(prefix="gpupool-reclaim-") as tmp, Platform(Path(tmp), fleet, extra) as p:
        headers = {"Authorization": f"Bearer {p.run['admin_token']}"}
        with httpx.Client(base_url=p.run["gateway_url"], headers=headers, timeout=30) as api:
            api.put("/v1/reclaim-policies/dev", json={"idle_after_s": idle_after_s, "grace_s": grace_s,
                                                      "idle_util_pct": 5}).raise_for_status()
            start = datetime.now(UTC)
            submitted: dict[str, str] = {}
            for i in range(jobs):
                kind = "dev" if i % 3 == 2 else "training"
                body = {"name": f"{kind}-{i}", "team": ("research", "inference")[i % 2], "gpus": 1, "kind": kind,
                        "gpu_models": ["L40S"]}
                submitted[api.post("/v1/jobs", json=body).json()["job_id"]] = kind
            time.sleep(window_s)
            end = datetime.now(UTC)
            allocations = []
            cursor = None
            while True:
                page = api.get("/v1/allocations", params={"limit": 1000, **({"cursor": cursor} if cursor else {})})
                doc = page.json()
                allocations += doc["items"]
                if not (cursor := doc.get("next")):
                    break
            waste = api.get("/v1/reports/waste", params={"from": (start - timedelta(minutes=1)).isoformat()}).json()
            for job_id in submitted:
                api.post(f"/v1/jobs/{job_id}/cancel")
    hours = lambda a, b: max(0.0, (b - a).total_seconds()) / 3600  # noqa: E731
    ts = datetime.fromisoformat
    reclaimed = [a for a in allocations if a["release_reason"] == "IdleReclaimed"]
    dev = [a for a in allocations if submitted.get(a["job_id"]) == "dev"]
    held_idle = sum(hours(ts(a["granted_at"]), ts(a["released_at"])) * len(a["gpus"]) for a in reclaimed)
    recovered = sum(hours(ts(a["released_at"]), end) * len(a["gpus"]) for a in reclaimed)
    held_total = sum(hours(ts(a["granted_at"]), ts(a["released_at"]) if a["released_at"] else end) * len(a["gpus"])
                     for a in allocations)
    named = {a["allocation_id"] for a in waste.get("idle_allocations", [])}
    return {
        "nodes": nodes, "gpus": nodes * 8, "jobs": jobs, "dev_sessions": len(dev), "window_s": window_s,
        "idle_after_s": idle_after_s, "grace_s": grace_s, "reclaimed": len(reclaimed),
        "gpu_hours_held_idle_before_reclaim": round(held_idle, 4), "gpu_hours_recovered": round(recovered, 4),
        "recovered_share": round(recovered / (recovered + held_idle), 4) if reclaimed else 0.0,
        "gpu_hours_allocated_in_window": round(held_total, 4),
        "waste_report_named_reclaimed": len(named & {a["allocation_id"] for a in reclaimed}),
        "waste_report_idle_gpu_hours": waste.get("idle_gpu_hours"),
        "busy_jobs_reclaimed": sum(1 for a in reclaimed if submitted.get(a["job_id"]) != "dev"),
    }


def markdown(r: dict, command: str) -> str:
    return "\n".join([
        BEGIN,
        "## GPU-hours recovered by reclamation",
        "",
        f"`{command}` — a real `gpupool up` on {r['nodes']} simulated nodes × 8 L40S ({r['gpus']} GPUs) with telemetry "
        f"flowing; {r['jobs']} one-GPU jobs, every third an interactive dev session that goes idle, the rest training; "
        f"dev reclaim policy: idle after {r['idle_after_s']:g} s below 5% utilization, then {r['grace_s']:g} s of "
        f"grace; measured over {r['window_s']:g} s. Machine: {benchdoc.machine()}.",
        "",
        "| measure | value |",
        "| --- | --- |",
        f"| idle dev sessions reclaimed | {r['reclaimed']} of {r['dev_sessions']} |",
        f"| busy (training) jobs reclaimed | {r['busy_jobs_reclaimed']} |",
        f"| GPU-hours the idle sessions held before reclaim | {r['gpu_hours_held_idle_before_reclaim']:.3f} |",
        f"| GPU-hours recovered (released → end of window) | {r['gpu_hours_recovered']:.3f} |",
        f"| share of the idle sessions' GPU-time recovered | {100 * r['recovered_share']:.0f}% |",
        f"| GPU-hours allocated in the window (all jobs) | {r['gpu_hours_allocated_in_window']:.3f} |",
        f"| reclaimed allocations the waste report names (from rollups) | {r['waste_report_named_reclaimed']} of "
        f"{r['reclaimed']} |",
        "",
        "Recovered GPU-hours grow with the window: a session nobody uses would otherwise hold its GPU until someone "
        "notices; reclamation bounds what each one wastes to its idle window plus the grace period.",
        END,
    ])


def write_section(path: Path, section: str) -> None:
    benchdoc.write_section(path, BEGIN, END, section)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpupool bench reclaim", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=4, help="simulated nodes of 8 L40S")
    parser.add_argument("--jobs", type=int, default=30, help="one-GPU jobs (every third a dev session)")
    parser.add_argument("--window", type=float, default=180.0, help="seconds measured")
    parser.add_argument("--idle-after", type=float, default=30.0, help="dev sessions' idle window, seconds")
    parser.add_argument("--grace", type=float, default=15.0, help="grace after the warning, seconds")
    parser.add_argument("--doc", type=Path, default=Path("docs/benchmarks.md"))
    args = parser.parse_args(argv)
    result = run(args.nodes, args.jobs, args.window, args.idle_after, args.grace)
    command = "gpupool bench reclaim " + " ".join(argv if argv is not None else sys.argv[1:])
    write_section(args.doc, markdown(result, command.strip()))
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
