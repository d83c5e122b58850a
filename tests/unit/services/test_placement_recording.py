"""Placement records each decision as a delta against a keyframe (services/placement/recording.py): what is read
back must be exactly the texts that were recorded (their digests are what replay checks), a delta may only
stand on a keyframe that committed, and a record that cannot be read says so."""

from __future__ import annotations

import gzip
import json
import random

import pytest

from libs.core import codec, schedule
from services.placement.encoder import DecisionEncoder, Encoded
from services.placement.recording import DeltaRecorder, RecordError, expand, stored_texts

TOKENS = {"nodes": json.dumps("\x1eT:nodes"), "pending": json.dumps("\x1eT:pending")}


def encoded(nodes: list[str], pending: list[str], now: int) -> dict[str, Encoded]:
    frame = f'{{"snapshot":{{"nodes":{TOKENS["nodes"]}}},"pending":{TOKENS["pending"]},"now":{now}}}'
    plan = f'{{"placements":[],"pending":{TOKENS["pending"]}}}'
    return {"input": Encoded(frame, dict(TOKENS), {"nodes": list(nodes), "pending": list(pending)}),
            "plan": Encoded(plan, {"pending": TOKENS["pending"]}, {"pending": [p.replace("j", "r") for p in pending]})}


def texts(parts: dict[str, Encoded]) -> dict[str, str]:
    return {name: enc.text() for name, enc in parts.items()}


def item(kind: str, k: int, v: int = 0) -> str:
    return json.dumps({kind: k, "v": v, "s": "a\nb \x1d"}, separators=(",", ":"))  # escapes stay escaped


def test_every_record_reads_back_exactly_across_random_changes_and_keyframes() -> None:
    rng = random.Random(7)
    rec = DeltaRecorder(every=5)
    nodes = [item("n", k) for k in range(30)]
    pending = [item("j", k) for k in range(200)]
    keyframes: dict[str, str] = {}
    kinds, listed = [], 0
    for cycle in range(40):
        for _ in range(rng.randint(0, 6)):  # jobs leave, arrive, nodes change, order moves
            op = rng.choice(["leave", "arrive", "node", "swap", "swap", "interleave"])
            if op == "leave" and pending:
                pending.pop(rng.randrange(len(pending)))
            elif op == "arrive":
                pending.insert(rng.randrange(len(pending) + 1), item("j", 1000 + cycle * 10 + rng.randrange(10)))
            elif op == "node":
                k = rng.randrange(len(nodes))
                nodes[k] = item("n", k, cycle)
            elif op == "interleave":  # fair share reordered the queue: thousands of runs of one item
                pending = pending[0::2] + pending[1::2]
            elif len(pending) > 2:
                a, b = rng.sample(range(len(pending)), 2)
                pending[a], pending[b] = pending[b], pending[a]
        parts = encoded(nodes, pending, cycle)
        cycle_id = f"c{cycle:03d}"
        base, record = rec.record(cycle_id, parts)
        kinds.append(base is None)
        got = expand(record, keyframes.get(base)) if base else expand(record)
        assert got == texts(parts)
        assert json.loads(got["input"])["now"] == cycle
        if base is None:
            keyframes[cycle_id] = record
        else:
            assert len(record) < len(keyframes[base]) / 2  # a delta is much smaller than its keyframe
            listed += any(line.startswith("@") and "," in line for line in record.replace("\x1d", "\n").split("\n"))
        rec.committed()
    # a keyframe first, then at most `every` deltas against each
    assert kinds[0] and sum(kinds) >= 40 // 6 and not all(kinds)
    assert listed  # reordered items went as positions


def test_a_delta_stands_only_on_a_committed_keyframe() -> None:
    rec = DeltaRecorder()
    parts = encoded([item("n", 0)], [item("j", k) for k in range(10)], 1)
    base, first = rec.record("c1", parts)
    assert base is None
    # the cycle that wrote the keyframe rolled back: the next record is a keyframe too
    base, _ = rec.record("c2", parts)
    assert base is None
    rec.committed()
    base, delta = rec.record("c3", encoded([item("n", 0)], [item("j", k) for k in range(1, 10)], 3))
    assert base == "c2"
    rec.committed()  # a committed delta leaves the keyframe as it is
    assert rec.record("c4", parts)[0] == "c2"
    rec.forget()  # another replica led meanwhile
    assert rec.record("c5", parts)[0] is None


def test_a_cycle_that_changed_most_items_is_recorded_as_a_keyframe() -> None:
    rec = DeltaRecorder()
    rec.record("c1", encoded([item("n", 0)], [item("j", k) for k in range(100)], 1))
    rec.committed()
    assert rec.record("c2", encoded([item("n", 0)], [item("j", k) for k in range(90, 190)], 2))[0] is None


def test_a_record_that_cannot_be_read_back_says_why() -> None:
    rec = DeltaRecorder()
    parts = encoded([item("n", 0)], [item("j", 1), item("j", 2)], 1)
    _, key = rec.record("c1", parts)
    rec.committed()
    _, delta = rec.record("c2", encoded([item("n", 0)], [item("j", 2)], 2))
    with pytest.raises(RecordError, match="without its keyframe"):
        expand(delta)
    with pytest.raises(RecordError, match="is itself a delta"):
        expand(delta, delta)
    with pytest.raises(RecordError, match="outside its keyframe"):
        expand(delta.replace("@1", "@1,5"), key)  # a single item kept, by position
    runs = DeltaRecorder()
    _, first = runs.record("k1", encoded([item("n", 0)], [item("j", k) for k in range(8)], 1))
    runs.committed()
    _, longer = runs.record("k2", encoded([item("n", 0)], [item("j", k) for k in range(9)], 2))
    assert "\x1d=0,8\n" in longer  # a run of eight kept
    with pytest.raises(RecordError, match="outside its keyframe"):
        expand(longer.replace("=0,8", "=0,12"), first)
    with pytest.raises(RecordError, match="header"):
        expand("not json" + delta)
    with pytest.raises(RecordError, match="sections"):
        expand(key.rsplit("\x1d", 1)[0])


def test_stored_rows_of_both_forms_read_back() -> None:
    rec = DeltaRecorder()
    parts = encoded([item("n", 0)], [item("j", 1), item("j", 2)], 1)
    _, key = rec.record("c1", parts)
    rec.committed()
    later = encoded([item("n", 0)], [item("j", 2), item("j", 3)], 2)
    _, delta = rec.record("c2", later)
    gz = lambda t: gzip.compress(t.encode())  # noqa: E731
    assert stored_texts({"record_gz": gz(key), "base_gz": None}) == (parts["input"].text(), parts["plan"].text())
    assert stored_texts({"record_gz": gz(delta), "base_gz": gz(key)}) == (later["input"].text(),
                                                                          later["plan"].text())
    old = {"record_gz": None, "input_gz": gz('{"now":1}'), "plan_json": '{"placements":[]}'}
    assert stored_texts(old) == ('{"now":1}', '{"placements":[]}')


def test_the_encoders_parts_recorded_as_deltas_read_back_as_the_codecs_text() -> None:
    from services.placement.domain import build_policy, build_requests, build_snapshot
    from tests.unit.services.test_placement_decision_encoder import GPUS, NODES, running, wanted

    enc, rec, keyframes = DecisionEncoder(), DeltaRecorder(every=3), {}
    policy = build_policy("default", [], [], [], 300.0, 7 * 24 * 3600.0)
    backlog = [wanted(k) for k in range(30)]
    for c in range(8):
        snapshot = build_snapshot(NODES, GPUS, [running(k, k % 3) for k in range(c % 4)])
        requests = build_requests(backlog[c:], {}, {"fractional": {"L40S"}, "mig": {"A100-80GB"}})
        plan = schedule(snapshot, requests, policy, now=1.8e9 + c)
        parts = {"input": enc.input_parts(snapshot, requests, policy, 1.8e9 + c), "plan": enc.plan_parts(plan)}
        base, record = rec.record(f"c{c}", parts)
        got = expand(record, keyframes.get(base))
        assert got["input"] == codec.dumps({"snapshot": snapshot, "pending": tuple(requests), "policy": policy,
                                            "now": 1.8e9 + c})
        assert got["plan"] == codec.dumps(plan)
        if base is None:
            keyframes[f"c{c}"] = record
        rec.committed()
        enc.turn()
