"""Placement's scheduling cycle at fleet size, on its real store: `gpupool bench placement-cycle`.

Starts its own PostgreSQL and NATS (libs.devstack, unsafe-fast PostgreSQL settings) and runs the measurement
(services/placement/cyclebench.py) in its own process, which fills placement's store the way
its events would (nodes and GPUs registered, jobs wanted, allocations written by the store's own statements) with
N nodes × 8 GPUs, R running allocations that fill every GPU, and W waiting jobs; then runs placement's own cycle
(`PlacementHandlers.run_cycle`) and times its phases (`PlacementHandlers.phases`: the snapshot's load, the core's
build of its indexes, the core's cycle, the plan's store) and the CPU time placement's process spent on it. After a
first, cold cycle it turns jobs over: one running one-GPU job completes (placement's own release path) and the next
cycle must give the freed GPU to a waiting job; the time from the release's commit to the cycle's commit is the
freed GPU's "next job" time without the loop's gather wait. No services or agents run: this measures placement's cycle alone.

With `--write` the result replaces its section of docs/benchmarks.md; without, it only prints.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

BEGIN, END = "<!-- placement-cycle-benchmark:begin -->", "<!-- placement-cycle-benchmark:end -->"
GPUS_PER_NODE = 8


def render(result: dict) -> str:
    from libs.bench.benchdoc import machine

    ms = lambda v: f"{v * 1000:.0f}"  # noqa: E731
    cold, steady, p90 = result["cold"], result["steady"], result["steady_p90"]
    lines = [
        BEGIN,
        "## Placement's cycle at fleet size (`gpupool bench placement-cycle`)",
        "",
        f"Placement's own cycle on its real store (PostgreSQL, unsafe-fast settings): {result['nodes']} nodes × "
        f"{GPUS_PER_NODE} GPUs, {result['running']} running allocations filling every GPU, {result['waiting']} "
        f"waiting jobs. A cold first cycle, then {result['turnovers']} turnovers: a running one-GPU job completes "
        "and the next cycle gives its GPU to a waiting job (no services, agents or gather wait: the cycle alone).",
        "",
        "| cycle | total ms | load ms | build ms | core ms | store ms | CPU ms |",
        "| --- | --- | --- | --- | --- | --- | --- |",
        f"| cold (first) | {ms(cold['total_s'])} | {ms(cold['load_s'])} | {ms(cold['build_s'])} | "
        f"{ms(cold['core_s'])} | {ms(cold['store_s'])} | {ms(cold['cpu_s'])} |",
        f"| turnover, median | {ms(steady['cycle_s'])} | {ms(steady['load_s'])} | {ms(steady['build_s'])} | "
        f"{ms(steady['core_s'])} | {ms(steady['store_s'])} | {ms(steady['cpu_s'])} |",
        f"| turnover, p90 | {ms(p90['cycle_s'])} | {ms(p90['load_s'])} | {ms(p90['build_s'])} | "
        f"{ms(p90['core_s'])} | {ms(p90['store_s'])} | {ms(p90['cpu_s'])} |",
        "",
        f"Freed GPU to its next job (release committed → cycle committed): median {ms(steady['next_job_s'])} ms; "
        f"{result['placed']} of {result['turnovers']} freed GPUs were given a job.",
        "",
        "Phases: *load*, the cycle's one snapshot statement (nodes with their GPUs, wanted jobs and live "
        "allocations read whole only where changed) and its decoding; *build*, the core's `Scheduler` built, or the one kept from "
        "the last committed cycle brought up to date (services/placement/README.md, **The kept scheduler**); "
        "*core*, the snapshot's objects, the units, the fragmentation mix and the core's cycle; *store*, the "
        "placements, reasons, queue order and the recorded decision, to the commit; *CPU*, the CPU time "
        "placement's process spent on the cycle (PostgreSQL's own is not in it): on a shared machine the wall "
        "time also counts waiting for a CPU.",
        "",
        f"Machine: {machine()}; 1-minute load average {_load(result)}.",
        END,
    ]
    return "\n".join(lines)


def _load(result: dict) -> str:
    """The machine's 1-minute load average when the turnovers began and ended: above its CPU count, the wall time
    of a cycle also counts waiting for a CPU (the CPU column does not)."""
    if "load_avg" not in result:
        return "not measured"
    first, last = result["load_avg"]
    return f"{first:.1f} at the first cycle, {last:.1f} at the last"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpupool bench placement-cycle", description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1024)
    parser.add_argument("--running", type=int, default=6000)
    parser.add_argument("--waiting", type=int, default=10_000)
    parser.add_argument("--turnovers", type=int, default=20)
    parser.add_argument("--json", type=Path, help="also write the result as JSON here")
    parser.add_argument("--write", type=Path, nargs="?", const=Path("docs/benchmarks.md"), default=None,
                        help="replace this benchmark's section of the file (default docs/benchmarks.md)")
    args = parser.parse_args(argv)
    from libs.bench.benchdoc import write_section
    from libs.devstack.servers import start_nats, start_postgres
    from libs.store.database import with_database

    tmp = Path(tempfile.mkdtemp(prefix="gpupool-bench-cycle-"))
    pg = start_postgres(tmp / "pg", durable=False)
    nats = start_nats(tmp / "nats")
    try:
        # placement's own code runs in its own process (libraries never import a service)
        code = subprocess.call([sys.executable, "-m", "services.placement.cyclebench", "--nats-url", nats.url,
                                "--database-url", with_database(pg.url, "placement_bench"),
                                "--nodes", str(args.nodes), "--running", str(args.running),
                                "--waiting", str(args.waiting), "--turnovers", str(args.turnovers),
                                "--out", str(tmp / "result.json")])
        if code != 0:
            print(f"the measurement failed (exit {code})", file=sys.stderr)
            return code
        result = json.loads((tmp / "result.json").read_text())
    finally:
        nats.stop()
        pg.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    text = render(result)
    print(text)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    if args.write:
        write_section(args.write, BEGIN, END, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
