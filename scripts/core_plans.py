"""Every plan the scheduling core makes on fixed scenarios, as JSON: `python scripts/core_plans.py OUT.json`.

For a refactor of libs/core that must not change behaviour: run it on both commits (a `git worktree` of the old
one) and compare the files byte for byte. Scenarios: one-shot cycles of three policies on a synthetic fleet of 96
nodes (whole GPUs, NVLink gangs, fractions, MIG, CPU-only, replicas, quotas, classes), a scheduler kept across
cycles with ends and arrivals, and a full small cluster that high-priority and guaranteed work preempts (by
priority, for guarantees, with and without the ski-rental wait), with reservations. Timings are left out.
(tests/sim/test_sim_pinned.py pins a small fill and replay the same way in the suite.)"""
import dataclasses
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from libs.core import JobRequest, Policy, Scheduler, Snapshot, schedule, teams_quota  # noqa: E402
from libs.bench.core import _as_allocations, _policies, synthetic_cluster, synthetic_jobs  # noqa: E402


def rep(plan) -> dict:  # type: ignore[no-untyped-def]
    d = dataclasses.asdict(plan)
    d["stats"] = [s for s in d["stats"] if not s[0].endswith("_us")]
    return json.loads(json.dumps(d, default=str))


def fleet_plans(out: dict) -> None:
    """One-shot cycles, then a scheduler kept across cycles with ends and high-priority arrivals."""
    nodes = synthetic_cluster(96)
    jobs = synthetic_jobs(2500)
    for name, pol in _policies(96):
        out[f"one/{name}"] = rep(schedule(Snapshot(tuple(nodes)), jobs, pol, 0.0))
    by_id = {j.job_id: j for j in jobs}
    for name, pol in _policies(96)[:2]:
        s = Scheduler(Snapshot(tuple(nodes)), pol)
        plan = s.cycle(jobs, 0.0)
        out[f"kept0/{name}"] = rep(plan)
        placed = {p.job_id for p in plan.placements}
        running = _as_allocations(plan, by_id, 0.0)
        late = [dataclasses.replace(j, job_id="late-" + j.job_id, submitted_at=7000.0 + i,
                                    priority_class="production-inference" if i % 3 == 0 else j.priority_class)
                for i, j in enumerate(synthetic_jobs(400, seed=7))]
        backlog = [j for j in jobs if j.job_id not in placed] + late
        for t in (7200.0, 9000.0, 30000.0):
            out[f"later/{name}/{t}"] = rep(schedule(Snapshot(tuple(nodes), running=tuple(running)), backlog, pol, t))
        for k in range(4):  # ends and arrivals between cycles
            for jid in sorted(placed)[k * 50:(k + 1) * 50]:
                s.finish(jid)
            out[f"kept/{name}/{k}"] = rep(s.cycle(backlog, 7200.0 + 600 * k))


def preemption_plans(out: dict) -> None:
    """A full small cluster of low-priority work, then high-priority and guaranteed arrivals."""
    small = synthetic_cluster(12, seed=5)
    low = [JobRequest(job_id=f"low-{i:03d}", team="team-0" if i % 2 else "team-1", gpus=(1, 2, 8)[i % 3],
                      kind="batch", priority_class="low", submitted_at=float(i), cpu_milli=1000, memory_mib=4096,
                      max_runtime_s=(None, 5000.0)[i % 2]) for i in range(200)]
    quotas = teams_quota({"team-0": 20, "team-1": 0, "team-2": 40})
    policies = (("default", Policy(name="default", quotas=quotas)),
                ("cost-off", Policy(name="default", quotas=quotas, preemption_cost=False)),
                ("priority-only", Policy(name="default")))
    high = [JobRequest(job_id=f"hi-{i:03d}", team=("team-0", "team-2")[i % 2], gpus=(1, 4, 8, 16)[i % 4],
                       gang_nodes=2 if i % 4 == 3 else 0, gpus_per_node=8 if i % 4 == 3 else 0, kind="training",
                       priority_class=("high", "normal", "production-inference")[i % 3], submitted_at=3000.0 + i)
            for i in range(40)]
    for name, pol in policies:
        first = schedule(Snapshot(tuple(small)), low, pol, 0.0)
        run = _as_allocations(first, {j.job_id: j for j in low}, 0.0)
        for t in (3100.0, 8000.0, 50000.0):
            out[f"preempt/{name}/{t}"] = rep(schedule(Snapshot(tuple(small), running=tuple(run)), high, pol, t))


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python scripts/core_plans.py OUT.json", file=sys.stderr)
        return 2
    out: dict = {}
    fleet_plans(out)
    preemption_plans(out)
    Path(argv[0]).write_text(json.dumps(out, sort_keys=True))
    print(f"{len(out)} plans written to {argv[0]}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
