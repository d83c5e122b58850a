"""docs/asyncapi.yaml: generated from libs/contracts, never stale, and its who-talks-to-whom tables held to the code.

The parser check with the real @asyncapi/parser is tests/unit/contracts/test_asyncapi_ecosystem.py.
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from libs.contracts import subjects
from libs.contracts.asyncapi import SERVICES, document, event_address, render
from libs.contracts.bus_map import CLOUDEVENT_SUBJECTS, DURABLE_CONSUMERS, NOT_EVENTS, RPCS
from libs.contracts.events import EVENT_TYPES
from libs.contracts.origins import owner_of

ROOT = Path(__file__).resolve().parents[3]
COMMITTED = ROOT / "docs" / "asyncapi.yaml"
ROUTED = ("inventory", "quota", "queue", "placement", "reclamation", "accounting")


class _AnyHandler:
    """Stands in for a service's handlers object: every attribute is another stand-in, so `routes(h)` builds."""

    def __getattr__(self, name: str) -> _AnyHandler:
        return _AnyHandler()


def _routes(service: str) -> Any:
    return importlib.import_module(f"services.{service}.handlers").routes(_AnyHandler())


def test_the_committed_document_is_the_generators_output() -> None:
    assert COMMITTED.read_text() == render(), (
        "docs/asyncapi.yaml is stale: regenerate with `.venv/bin/gpupool asyncapi` and commit the result")


def test_every_event_type_has_its_channel_message_and_owner_sending_it() -> None:
    doc = document()
    addresses = {ch["address"]: key for key, ch in doc["channels"].items()}
    for event_type, cls in EVENT_TYPES.items():
        channel = addresses[event_address(cls)]
        owner = owner_of(event_type)
        op = doc["operations"][f"{owner}.send.{channel}"]
        assert op["action"] == "send" and op["channel"] == {"$ref": f"#/channels/{channel}"}
        message = doc["components"]["messages"][event_type]
        assert message["externalDocs"]["url"] == f"https://gpupool.dev/schemas/{event_type}.json"
        schema = doc["components"]["schemas"][event_type]
        assert schema["properties"]["type"]["const"] == event_type and "dataschema" in schema["properties"]


def test_every_reference_points_at_something_in_the_document() -> None:
    doc = yaml.safe_load(COMMITTED.read_text())
    refs = re.findall(r"\$ref: '#/([^']+)'", COMMITTED.read_text())
    assert refs
    for ref in refs:
        node: Any = doc
        for part in ref.split("/"):
            node = node[part]  # KeyError: a dangling reference


@pytest.mark.parametrize("service", ROUTED)
def test_declared_consumers_are_the_services_routing_tables(service: str) -> None:
    routes = _routes(service)
    taken = {cls.event_type for cls in routes.events}
    if routes.telemetry is not None:
        taken.add("io.gpupool.telemetry.sampled.v1")
    bootstrap = (ROOT / "services" / service / "bootstrap.py").read_text()
    if "subjects.ROLLUP_ALL" in bootstrap:  # accounting's rollup consumer lives beside its routes
        taken.add("io.gpupool.telemetry.rolled_up.v1")
    assert set(DURABLE_CONSUMERS[service]) == taken


@pytest.mark.parametrize("service", ROUTED)
def test_declared_request_reply_answers_are_the_services_routing_tables(service: str) -> None:
    served = {subject.replace(".*.*", ".{cluster}.{node}"): model for subject, (model, _) in
              _routes(service).commands.items()}
    declared = {subject: rpc.request for subject, rpc in RPCS.items() if rpc.answers == service}
    assert served == declared


def _asks(service: str) -> set[str]:
    """The request/reply subjects a service's code names outside its own routing table."""
    found: set[str] = set()
    for path in (ROOT / "services" / service).rglob("*.py"):
        text = re.sub(r"\ndef routes\(.*", "", path.read_text(), flags=re.S)
        for name in re.findall(r"\bsubjects\.((?:CMD|QUERY)_[A-Z_]+)\b", text):
            found.add(getattr(subjects, name))
        if re.search(r"request\([\w.]+, subjects\.register_node\(", text):
            found.add(f"{subjects.CMD_INVENTORY_REGISTER_NODE}.{{cluster}}.{{node}}")
        if "request(" in text and "subjects.agent_logs(" in text:
            found.add("gpupool.query.agent.{cluster}.{node}.logs")
    return found


@pytest.mark.parametrize("service", SERVICES)
def test_declared_askers_are_what_each_services_code_asks(service: str) -> None:
    declared = {subject for subject, rpc in RPCS.items() if service in rpc.asks}
    assert _asks(service) == declared


def test_the_cloudevent_subjects_are_the_event_streams_and_exclude_request_reply() -> None:
    assert set(CLOUDEVENT_SUBJECTS) == {subj for st in subjects.STREAMS if st is not subjects.DLQ_STREAM
                                        for subj in st.subjects}
    for cls in EVENT_TYPES.values():
        concrete = event_address(cls).replace("{cluster}", "c").replace("{node}", "n")
        assert sum(subjects.matches(p, concrete) for p in CLOUDEVENT_SUBJECTS) == 1, concrete
        assert not any(subjects.matches(p, concrete) for p in NOT_EVENTS), concrete
    for address in [*RPCS, subjects.PLACEMENT_WAKE, subjects.SIM_FAULT, subjects.dead_letter("x")]:
        concrete = re.sub(r"\{\w+\}", "x", address)
        assert not any(subjects.matches(p, concrete) for p in CLOUDEVENT_SUBJECTS), address
        assert any(subjects.matches(p, concrete) for p in NOT_EVENTS), address
