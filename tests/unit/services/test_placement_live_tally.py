"""What a cycle derives from the live allocations, kept up to date with only each read's change
(services/placement/incremental.py, `LiveTally`): after any sequence of reads — grants, releases, preemptions
starting, a read it missed, a copy read whole again — it says what working it out from every row says."""

from __future__ import annotations

import random
from collections import Counter
from datetime import UTC, datetime, timedelta

from services.placement.domain import live_facts
from services.placement.incremental import LiveTally, WantedJobs

T0 = datetime(2026, 12, 1, tzinfo=UTC)


def _row(aid: str, rng: random.Random) -> dict:
    deadline = T0 + timedelta(seconds=rng.randint(1, 99)) if rng.random() < 0.2 else None
    return {"allocation_id": aid, "job_id": f"j{rng.randint(0, 9)}", "replica": rng.randint(0, 2),
            "team": rng.choice("ab"), "gpu_model": rng.choice(("H100", "A100", None)),
            "gpu_uuids": [f"g{i}" for i in range(rng.randint(1, 4))], "share_milli": rng.choice((1000, 500, 143)),
            "preempt_deadline": deadline, "preempted_by": f"p{rng.randint(0, 3)}" if deadline else None}


def _whole(rows: list[dict]) -> tuple:
    states, by_model, by_team = Counter(), Counter(), Counter()
    for r in rows:
        states["preempting" if r["preempt_deadline"] is not None else "running"] += 1
        held = len(r["gpu_uuids"]) * r["share_milli"]
        by_model[r["gpu_model"] or ""] += held
        by_team[(r["team"], r["gpu_model"] or "")] += held
    return ({s: states[s] for s in ("running", "preempting")}, {k: v for k, v in by_model.items() if v},
            {k: v for k, v in by_team.items() if v})


def test_the_tally_kept_from_changes_is_the_tally_of_every_row() -> None:
    for seed in range(20):
        rng = random.Random(seed)
        live, tally, store, n = WantedJobs("allocation_id"), LiveTally(), {}, 0
        for step in range(40):
            touched = set()
            for _ in range(rng.randint(0, 6)):
                if store and rng.random() < 0.4:
                    aid = rng.choice(sorted(store))
                    del store[aid]
                else:
                    aid = rng.choice(sorted(store)) if store and rng.random() < 0.3 else f"a{(n := n + 1)}"
                    store[aid] = _row(aid, rng)  # new, or changed (a preemption starting): a new row object
                touched.add(aid)
            changed = [store[a] for a in sorted(touched) if a in store]
            gone = [a for a in sorted(touched) if a not in store]
            if rng.random() < 0.05:
                live.forget()  # read whole again
                changed, gone = list(store.values()), []
            rows = live.merge(changed, gone, len(store), str(step))
            assert rows is not None
            if rng.random() < 0.1:
                continue  # a cycle that failed before it looked: the tally misses this change
            tally.update(live)
            replicas, deadline, waiting = tally.facts()
            want = live_facts(rows)
            assert ({j: set(replicas[j]) for j in replicas}, deadline, waiting) == (dict(want[0]), want[1], want[2])
            assert (tally.states, tally.by_model, tally.by_team) == _whole(rows)
