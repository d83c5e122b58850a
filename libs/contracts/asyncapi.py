"""The AsyncAPI 3.0 document of gpupool's bus (docs/asyncapi.yaml), generated from the contracts.

Every channel (a subject, or a subject pattern with `{cluster}`/`{node}`/`{service}`/`{consumer}` parameters), every
message with its payload schema, and who sends and who receives it, as operations named
`<service>.<send|receive|ask|answer>.<channel>`. Events are CloudEvents 1.0 in structured JSON mode: the payload
schema is the whole envelope, the same schema as docs/schemas/<type>.json (which the event's `dataschema` names).

Regenerate with `gpupool asyncapi` (or `python -m libs.contracts.asyncapi`); a unit test fails when the committed
document differs from this output.
"""

from __future__ import annotations

import argparse
import copy
import re
import sys
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel

from libs.contracts import subjects as s
from libs.contracts.bus_map import (
    CLOUDEVENT_SUBJECTS,
    DURABLE_CONSUMERS,
    LIVE_SUBSCRIBERS,
    NOT_EVENTS,
    PING_SUBJECT,
    RPCS,
    Rpc,
)
from libs.contracts.commands import Empty, Reply
from libs.contracts.events import EVENT_TYPES, EventData, event_json_schemas
from libs.contracts.origins import owner_of

DEFAULT_OUT = Path("docs/asyncapi.yaml")
VERSION = "1.0.0"  # of the bus contract as a whole; each event type carries its own `.vN`
SERVICES = ("inventory", "quota", "queue", "placement", "reclamation", "accounting", "gateway", "agent")
PARAMETERS = {
    "cluster": "The node's cluster, as one subject token (libs/contracts/subjects.py `token`).",
    "node": "The node's name, as one subject token.",
    "service": "A gpupool service's name.",
    "consumer": "The durable consumer that refused the message.",
}

_DESCRIPTION = f"""gpupool's NATS bus: events (CloudEvents 1.0, structured JSON mode, on JetStream streams), \
commands and queries (plain JSON request/reply on core NATS, answered by one service's queue group), and a few \
internal signals.

**Which wildcard gives the events.** Every CloudEvent gpupool publishes travels on one of these subjects, and \
nothing else does: {", ".join(f"`{p}`" for p in CLOUDEVENT_SUBJECTS)} (the subjects of the streams \
{s.EVENTS_STREAM.name}, {s.TELEMETRY_STREAM.name} and {s.ROLLUPS_STREAM.name}; \
`libs.contracts.bus_map.CLOUDEVENT_SUBJECTS`). Do not subscribe to `gpupool.>` for events: it also carries \
request/reply traffic and signals that are not CloudEvents ({", ".join(f"`{p}`" for p in NOT_EVENTS)}; dead \
letters are copies of messages refused as poison, with the reason in headers).

Each event's `dataschema` is its JSON Schema's `$id` (https://gpupool.dev/schemas/<type>.json, committed as \
docs/schemas/<type>.json); JetStream's `Nats-Msg-Id` header is the event id. Every request/reply answer is a \
`Reply`: `ok` with a `result`, or an `error` with an HTTP-like status and a reason."""


def _rewrite_refs(node: Any) -> Any:
    """Pydantic's local `#/$defs/X` references, pointed at the document's shared component schemas."""
    if isinstance(node, dict):
        return {k: (re.sub(r"^#/\$defs/", "#/components/schemas/", v) if k == "$ref" and isinstance(v, str)
                    else _rewrite_refs(v)) for k, v in node.items()}
    if isinstance(node, list):
        return [_rewrite_refs(v) for v in node]
    return node


class _Components:
    """Component schemas: each payload schema with its `$defs` hoisted beside it (one definition per name)."""

    def __init__(self) -> None:
        self.schemas: dict[str, Any] = {}

    def add(self, name: str, schema: dict[str, Any]) -> dict[str, str]:
        schema = copy.deepcopy(schema)
        for def_name, definition in schema.pop("$defs", {}).items():
            self._put(def_name, _rewrite_refs(definition))
        schema.pop("$schema", None)
        schema.pop("$id", None)  # an `$id` would rebase the `#/components/...` references inside it
        self._put(name, _rewrite_refs(schema))
        return {"$ref": f"#/components/schemas/{name}"}

    def _put(self, name: str, schema: dict[str, Any]) -> None:
        if self.schemas.setdefault(name, schema) != schema:
            raise ValueError(f"two different schemas are named {name!r}: rename one of the models")


def _key(address: str) -> str:
    """A channel's id: its address without the prefix, parameters as their names."""
    return re.sub(r"[{}]", "", address.removeprefix(f"{s.PREFIX}.")).replace(">", "all")


def _parameters(address: str) -> dict[str, Any]:
    return {p: {"description": PARAMETERS[p]} for p in re.findall(r"\{(\w+)\}", address)}


def _channel(address: str, description: str, messages: dict[str, str]) -> dict[str, Any]:
    out: dict[str, Any] = {"address": address, "description": description,
                           "messages": {m: {"$ref": f"#/components/messages/{ref}"} for m, ref in messages.items()}}
    if _parameters(address):
        out["parameters"] = _parameters(address)
    return out


def event_address(cls: type[EventData]) -> str:
    """The subject an event type travels on, node-scoped ones as `<base>.{cluster}.{node}`."""
    base = cls.event_subject
    if base in (s.TELEMETRY_ALL, s.ROLLUP_ALL):
        base = base.removesuffix(".>")
    elif not cls.node_scoped:
        return base
    return f"{base}.{{cluster}}.{{node}}"


def _consumers_of(event_type: str, address: str) -> list[tuple[str, str]]:
    """(service, how) for everyone who receives this event type."""
    out = [(svc, "durable JetStream consumer") for svc, types in DURABLE_CONSUMERS.items() if event_type in types]
    concrete = address.replace("{cluster}", "c").replace("{node}", "n")
    out += [(svc, "live core-NATS subscription") for svc, patterns in LIVE_SUBSCRIBERS.items()
            if any(s.matches(p, concrete) for p in patterns)]
    return sorted(out)


class _Builder:
    def __init__(self) -> None:
        self.components = _Components()
        self.messages: dict[str, Any] = {}
        self.channels: dict[str, Any] = {}
        self.operations: dict[str, Any] = {}

    def _op(self, service: str, verb: str, channel: str, message: str, **extra: Any) -> None:
        self.operations[f"{service}.{verb}.{channel}"] = {
            "action": "send" if verb in ("send", "ask") else "receive",
            "channel": {"$ref": f"#/channels/{channel}"},
            "messages": [{"$ref": f"#/channels/{channel}/messages/{message}"}],
            "tags": [{"name": service}],
            **extra,
        }

    def events(self) -> None:
        schemas = event_json_schemas()
        for event_type, cls in sorted(EVENT_TYPES.items()):
            address, channel = event_address(cls), _key(event_address(cls))
            self.messages[event_type] = {
                "name": cls.__name__, "title": event_type, "summary": schemas[event_type]["description"],
                "contentType": "application/cloudevents+json",
                "payload": self.components.add(event_type, schemas[event_type]),
                "externalDocs": {"url": schemas[event_type]["$id"], "description": "the event's dataschema"},
            }
            self.channels[channel] = _channel(address, f"CloudEvents of type `{event_type}`.", {"event": event_type})
            owner = owner_of(event_type)
            assert owner is not None, event_type
            self._op(owner, "send", channel, "event", summary=f"{owner} publishes {event_type}")
            for service, how in _consumers_of(event_type, address):
                self._op(service, "receive", channel, "event", summary=f"{service} takes it: {how}")

    def rpcs(self) -> None:
        self.messages["Reply"] = {"name": "Reply", "contentType": "application/json",
                                  "summary": "The answer to every command and query: `ok` with `result`, or `error`.",
                                  "payload": self.components.add("Reply", Reply.model_json_schema())}
        self.channels["replies"] = {
            "address": None, "description": "The requester's reply inbox (`_INBOX...`), chosen per request.",
            "messages": {"reply": {"$ref": "#/components/messages/Reply"}},
        }
        rpcs = dict(RPCS)
        for service in SERVICES[:-2]:
            rpcs[PING_SUBJECT.replace("{service}", service)] = _ping(service)
        for address, rpc in sorted(rpcs.items()):
            channel = _key(address)
            name = rpc.request.__name__
            self.messages.setdefault(name, {"name": name, "contentType": "application/json",
                                            "summary": _doc(rpc.request),
                                            "payload": self.components.add(name, rpc.request.model_json_schema())})
            kind = "command" if ".cmd." in address else "query"
            self.channels[channel] = _channel(address, f"A {kind} answered by {rpc.answers} (request/reply).",
                                              {"request": name})
            reply = {"channel": {"$ref": "#/channels/replies"},
                     "messages": [{"$ref": "#/channels/replies/messages/reply"}]}
            self._op(rpc.answers, "answer", channel, "request", reply=reply)
            for asker in rpc.asks:
                self._op(asker, "ask", channel, "request", reply=reply)

    def signals(self) -> None:
        self.messages["DeadLetter"] = {
            "name": "DeadLetter", "summary": "A copy of a message refused as poison; the reason is in its headers.",
            "payload": {"description": "The refused message's bytes, unchanged (not necessarily JSON)."}}
        self.channels["dlq.consumer"] = _channel(f"{s.PREFIX}.dlq.{{consumer}}",
                                                 f"Dead letters (stream {s.DLQ_STREAM.name}).", {"letter": "DeadLetter"})
        for service in SERVICES[:-2]:
            self._op(service, "send", "dlq.consumer", "letter", summary=f"{service}'s consumers dead-letter poison")
        self.messages["Wake"] = {"name": "Wake", "summary": "No payload: a placement replica committed a change.",
                                 "payload": {"type": "string", "maxLength": 0}}
        self.channels["internal.placement.wake"] = _channel(s.PLACEMENT_WAKE, "Placement replicas wake their "
                                                            "leader (core NATS).", {"wake": "Wake"})
        self._op("placement", "send", "internal.placement.wake", "wake")
        self._op("placement", "receive", "internal.placement.wake", "wake")
        self.messages["SimFault"] = {
            "name": "SimFault", "contentType": "application/json",
            "summary": "Fault injection for the simulated fleet (development and tests only).",
            "payload": {"type": "object", "required": ["node", "fault"],
                        "properties": {"node": {"type": "string"}, "fault": {"type": "string"},
                                       "gpu": {"type": "integer"}, "seconds": {"type": "number"}}}}
        self.channels["sim.fault"] = _channel(s.SIM_FAULT, "Simulated faults (core NATS).", {"fault": "SimFault"})
        self._op("agent", "receive", "sim.fault", "fault")


def _ping(service: str) -> Rpc:
    return Rpc(Empty, service, ("gateway",))


def _doc(model: type[BaseModel]) -> str:
    return (model.__doc__ or model.__name__).strip().splitlines()[0]


def document() -> dict[str, Any]:
    """The AsyncAPI 3.0.0 document, as a plain mapping."""
    b = _Builder()
    b.events()
    b.rpcs()
    b.signals()
    return {
        "asyncapi": "3.0.0",
        "info": {"title": "gpupool bus", "version": VERSION, "description": _DESCRIPTION,
                 "tags": [{"name": svc} for svc in SERVICES]},
        "defaultContentType": "application/json",
        "servers": {"nats": {"host": "localhost:4222", "protocol": "nats",
                             "description": "The platform's NATS (JetStream enabled); `gpupool up` prints its URL."}},
        "channels": b.channels,
        "operations": b.operations,
        "components": {"messages": b.messages, "schemas": dict(sorted(b.components.schemas.items()))},
    }


class _NoAliases(yaml.SafeDumper):
    """Writes a mapping used twice twice, instead of as a YAML anchor and alias."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def render() -> str:
    header = "# Generated by `gpupool asyncapi` from libs/contracts (libs/contracts/asyncapi.py): do not edit.\n"
    return header + yaml.dump(document(), Dumper=_NoAliases, sort_keys=False, width=120, allow_unicode=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpupool asyncapi", description="write docs/asyncapi.yaml")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    args.out.write_text(render())
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
