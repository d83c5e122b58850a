"""Who may send which event (libs/contracts/origins.py): every event type has an owner, the owner is the service
that publishes it and the one NATS lets publish its subject, and an event is taken only from its owner, on its
publisher's subject, without NUL characters, within its model's bounds."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest
import yaml

from libs.contracts.envelope import InvalidEnvelope
from libs.contracts.events import EVENT_TYPES, QuotaSet, TelemetrySampled, subject_for
from libs.contracts.origins import accept, owner_of, source_allowed

NOW = datetime(2026, 12, 1, tzinfo=UTC)
PERMISSIONS = Path(__file__).resolve().parents[3] / "deploy" / "nats" / "permissions.yaml"


def may_publish(patterns: list[str], subject: str) -> bool:
    for pattern in patterns:
        want, have = pattern.split("."), subject.split(".")
        ok = True
        for i, token in enumerate(want):
            if token == ">":
                ok = len(have) > i
                break
            if i >= len(have) or token not in ("*", have[i]):
                ok = False
                break
        else:
            ok = len(want) == len(have)
        if ok:
            return True
    return False


@pytest.mark.parametrize("event_type", sorted(EVENT_TYPES))
def test_every_event_type_has_an_owner_that_nats_lets_publish_its_subject(event_type: str) -> None:
    owner = owner_of(event_type)
    assert owner is not None, f"{event_type} has no owner"
    doc = yaml.safe_load(PERMISSIONS.read_text())
    services = dict(doc["services"])
    # the agent's rights are per node: node n of cluster c may publish only its own subjects
    services["agent"] = {"publish": [p.format(cluster="c", node="n") for p in doc["agent_node"]["publish"]]}
    cls = EVENT_TYPES[event_type]
    subject = cls.event_subject.replace(">", "c.n") + (".c.n" if cls.node_scoped else "")
    assert may_publish(services[owner]["publish"], subject), f"{owner} may not publish {subject}"
    others = [s for s, p in services.items() if s != owner and may_publish(p["publish"], subject)]
    assert others == [], f"{subject} is publishable by {others} too"


def test_the_source_must_be_the_owner_and_the_agent_may_name_its_node() -> None:
    assert source_allowed("io.gpupool.quota.set.v1", "/gpupool/quota")
    assert not source_allowed("io.gpupool.quota.set.v1", "/gpupool/quota/x")
    assert not source_allowed("io.gpupool.quota.set.v1", "/gpupool/agent")
    assert source_allowed("io.gpupool.agent.work_started.v1", "/gpupool/agent/local/sim-node-0")
    assert not source_allowed("io.gpupool.job.submitted.v9", "/gpupool/queue")  # unknown version
    assert owner_of("io.gpupool.telemetry.sampled.v1") == "agent"
    assert owner_of("io.gpupool.telemetry.rolled_up.v1") == "inventory"


def quota_json(**data: object) -> bytes:
    doc = json.loads(QuotaSet(path="default/t", gpu_model="*", guaranteed=2, revision=3,
                              set_at=NOW).to_cloudevent("/gpupool/quota").to_json())
    doc["data"].update(data)
    return json.dumps(doc).encode()


def test_a_valid_event_from_its_owner_on_its_subject_is_taken() -> None:
    event, data = accept(quota_json(), "gpupool.quota.set")
    assert isinstance(data, QuotaSet) and data.guaranteed == 2 and event.source == "/gpupool/quota"


@pytest.mark.parametrize(("data", "subject", "why"), [
    ({}, "gpupool.quota.priority_class_set", "arrived on"),
    ({"guaranteed": 1e308}, "gpupool.quota.set", "guaranteed"),
    ({"weight": 0}, "gpupool.quota.set", "weight"),
    ({"revision": -1}, "gpupool.quota.set", "revision"),
    ({"gpu_model": "H100\u0000"}, "gpupool.quota.set", "NUL"),
    ({"path": "x" * 201}, "gpupool.quota.set", "path"),
])
def test_what_a_forger_writes_is_refused(data: dict, subject: str, why: str) -> None:
    with pytest.raises(InvalidEnvelope, match=why):
        accept(quota_json(**data), subject)


def test_a_text_that_only_spells_a_nul_escape_is_not_refused() -> None:
    _, data = accept(quota_json(gpu_model="H100\\u0000"), "gpupool.quota.set")  # backslash, u, 0000
    assert data.gpu_model == "H100\\u0000"


def test_telemetry_must_come_on_the_subject_of_the_node_it_names() -> None:
    sample = TelemetrySampled(cluster="c", node="n1", sampled_at=NOW, gpus=[])
    raw = sample.to_cloudevent("/gpupool/agent").to_json()
    assert accept(raw, subject_for(sample))[1] == sample
    with pytest.raises(InvalidEnvelope, match="arrived on"):
        accept(raw, "gpupool.telemetry.c.n2")  # another node's subject: a forgery of n1's readings


def test_any_event_refuses_numbers_beyond_what_the_platform_counts() -> None:
    from libs.contracts.events import JobSubmitted

    with pytest.raises(ValueError, match="less than or equal to 9007199254740992"):
        JobSubmitted(job_id="j", name="n", team="t", project="p", kind="batch", priority_class="normal",
                     priority=10**20, gpus=1, submitted_at=NOW)
    with pytest.raises(ValueError):
        JobSubmitted(job_id="j", name="n", team="t", project="p", kind="batch", priority_class="normal",
                     priority=0, gpus=1, submitted_at=NOW, max_runtime_s=float("inf"))
