"""Micro-benchmark of the bus codec over the real envelope and event models: what one event costs to encode (the
outbox's `to_cloudevent` + `to_json`) and to decode (a consumer's `parse_envelope` + `decode_data`, and the one-pass
typed envelope of libs/bus/batch.py), against the same work done with the standard library's `json` or `orjson`
(when installed), and how much of it is validation (`model_construct` skips it; the events' own bounds are part of
their pydantic schema, libs/contracts/bounds.py).

    python -m libs.bench.codec [--n 20000]

Every variant is checked to give back the event it was given before it is timed.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from libs.bus.batch import typed_envelope
from libs.contracts.envelope import CloudEvent, parse_envelope
from libs.contracts.events import (
    AllocatedGpu,
    AllocationGranted,
    EventData,
    JobStateChanged,
    JobSubmitted,
    decode_data,
)
from libs.contracts.work import WorkSpec

try:  # optional: measured when installed, never required
    import orjson
except ImportError:  # pragma: no cover - depends on the environment
    orjson = None

AT = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)


def samples() -> list[EventData]:
    """Three events of every job's path: its submission (with work), a grant of 8 GPUs, a state change."""
    gpus = [AllocatedGpu(uuid=f"GPU-{i:08x}-0000-0000-0000-000000000000", index=i, model="H100-80GB")
            for i in range(8)]
    return [
        JobSubmitted(job_id="01a22ab3-a4cc-7c5f-a652-9e3e656ef811", name="llama-finetune", team="research",
                     project="default", kind="training", priority_class="normal", priority=100, gpus=8,
                     gpu_models=["H100-80GB"], submitted_at=AT, submitted_by="alice",
                     work=WorkSpec(command=["python", "train.py", "--epochs", "10"], env={"WANDB_MODE": "offline"})),
        AllocationGranted(allocation_id="01a22ab3-a4cc-7c5f-a652-9e3e656ef812",
                          job_id="01a22ab3-a4cc-7c5f-a652-9e3e656ef811", team="research", project="default",
                          cluster="local", node="sim-node-0", gpus=gpus, granted_at=AT, kind="training",
                          priority_class="normal",
                          environment={"CUDA_VISIBLE_DEVICES": ",".join(g.uuid for g in gpus)}),
        JobStateChanged(job_id="01a22ab3-a4cc-7c5f-a652-9e3e656ef811", team="research", project="default",
                        kind="training", previous="pending", current="running", reason="AllocationGranted",
                        message=None, at=AT),
    ]


def encoders() -> dict[str, Callable[[EventData], bytes]]:
    def pydantic(data: EventData) -> bytes:  # what the outbox does
        return data.to_cloudevent("/gpupool/bench", event_id="e1", time=AT).to_json()

    def envelope_dict(data: EventData) -> dict[str, Any]:
        return {"specversion": "1.0", "id": "e1", "source": "/gpupool/bench", "type": data.event_type,
                "subject": data.entity_id(), "time": AT.isoformat(), "datacontenttype": "application/json",
                "data": data.model_dump(mode="json")}

    out = {"pydantic (to_cloudevent + to_json)": pydantic,
           "stdlib json.dumps of model_dump": lambda d: json.dumps(envelope_dict(d)).encode()}
    if orjson is not None:
        out["orjson.dumps of model_dump"] = lambda d: orjson.dumps(envelope_dict(d))
    return out


def decoders() -> dict[str, Callable[[bytes], EventData]]:
    def typed(raw: bytes) -> EventData:
        cls = type(decode_data(parse_envelope(raw)))  # picked outside the timing in practice: one type per stream
        return typed_envelope(cls).model_validate_json(raw).data

    def construct(raw: bytes) -> EventData:  # no validation at all (what "validated once at the edge" would save)
        doc = json.loads(raw)
        return CloudEvent.model_construct(**doc).data  # type: ignore[return-value]

    out: dict[str, Callable[[bytes], EventData]] = {
        "pydantic (parse_envelope + decode_data)": lambda raw: decode_data(parse_envelope(raw)),
        "pydantic one pass (typed envelope)": typed,
        "stdlib json.loads + model_validate": lambda raw: decode_data(CloudEvent.model_validate(json.loads(raw))),
        "stdlib json.loads, no validation": construct,
    }
    if orjson is not None:
        out["orjson.loads + model_validate"] = lambda raw: decode_data(CloudEvent.model_validate(orjson.loads(raw)))
    return out


def per_event_us(fn: Callable[[Any], Any], items: list[Any], n: int) -> float:
    """CPU µs per call (process time, best of five: on a shared machine wall time measures the neighbours)."""
    rounds = max(1, n // len(items))
    best = float("inf")
    for _ in range(5):
        started = time.process_time()
        for _ in range(rounds):
            for item in items:
                fn(item)
        best = min(best, time.process_time() - started)
    return 1e6 * best / (rounds * len(items))


def run(n: int) -> dict[str, dict[str, float]]:
    events = samples()
    raws = [encoders()["pydantic (to_cloudevent + to_json)"](e) for e in events]
    for name, enc in encoders().items():  # every encoder gives a document the platform decodes to the same event
        assert [decode_data(parse_envelope(enc(e))) for e in events] == events, name
    for name, dec in decoders().items():
        got = [dec(r) for r in raws]
        assert all(g == e or g == e.model_dump(mode="json") for g, e in zip(got, events, strict=True)), name
    typed = {type(e): typed_envelope(type(e)) for e in events}
    result = {"encode": {name: per_event_us(enc, events, n) for name, enc in encoders().items()},
              "decode": {name: per_event_us(dec, raws, n) for name, dec in decoders().items()
                         if "typed" not in name}}
    result["decode"]["pydantic one pass (typed envelope)"] = per_event_us(
        lambda pair: typed[pair[0]].model_validate_json(pair[1]), list(zip(typed, raws, strict=True)), n)
    result["validation"] = {
        f"{type(e).__name__}.model_validate (payload only)": per_event_us(
            type(e).model_validate, [e.model_dump(mode="json")], n // 3) for e in events}
    result["size_bytes"] = {type(e).__name__: float(len(r)) for e, r in zip(events, raws, strict=True)}
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m libs.bench.codec", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=20000, help="events per timing (best of three)")
    args = parser.parse_args(argv)
    result = run(args.n)
    for section, rows in result.items():
        unit = "bytes" if section == "size_bytes" else "µs per event"
        print(f"{section} ({unit})")
        for name, value in rows.items():
            print(f"  {value:9.1f}  {name}")
    if orjson is None:
        print("(orjson is not installed: pip install orjson to compare it)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
