"""The synthetic task-list variants (libs/sim/mixes.py) the fill experiment is checked on besides openb's own."""

from __future__ import annotations

import csv
from pathlib import Path

from libs.sim import mixes

DATA = Path(__file__).parent / "data"


def _rows() -> list[dict]:
    with (DATA / "openb_sample_tasks.csv").open(newline="") as f:
        return list(csv.DictReader(f))


def test_pinned_pins_about_the_share_of_gpu_tasks_to_models_a_node_can_hold_them_on() -> None:
    rows = _rows()
    got = mixes.pinned(rows, share=0.33, seed=0)
    assert [r["name"] for r in got] == [r["name"] for r in rows] and got == mixes.pinned(rows, share=0.33, seed=0)
    gpu = [r for r in got if int(r["num_gpu"]) > 0]
    pinned = [r for r in gpu if r.get("gpu_spec")]
    assert 0.25 < len(pinned) / len(gpu) < 0.41
    specs = dict(mixes.PINNED_SPECS)
    for r in pinned:
        assert r["gpu_spec"] in specs
        assert max(mixes.MODEL_GPUS[m] for m in r["gpu_spec"].split("|")) >= int(r["num_gpu"])
    assert not any(r.get("gpu_spec") for r in got if int(r["num_gpu"]) == 0)
    assert not any(r.get("gpu_spec") for r in mixes.pinned(rows, share=0.0))


def test_sharing_keeps_the_cpu_only_tasks_and_makes_the_share_of_gpu_tasks_shared() -> None:
    rows = _rows()
    got = mixes.sharing(rows, share=0.8, seed=0)
    assert len(got) == len(rows) and len({r["name"] for r in got}) == len(got)
    assert sum(int(r["num_gpu"]) == 0 for r in got) == sum(int(r["num_gpu"]) == 0 for r in rows)
    gpu = [r for r in got if int(r["num_gpu"]) > 0]
    shared = [r for r in gpu if int(r["num_gpu"]) == 1 and int(r["gpu_milli"]) < 1000]
    assert 0.7 < len(shared) / len(gpu) < 0.9


def test_the_command_writes_a_task_list_the_simulator_reads(tmp_path: Path) -> None:
    out = tmp_path / "pinned.csv"
    assert mixes.main(["pinned", str(DATA / "openb_sample_tasks.csv"), str(out)]) == 0
    from libs.sim import traces
    tasks = traces.read_tasks(out)
    assert len(tasks) == len(_rows()) and any(t.gpu_spec for t in tasks)
