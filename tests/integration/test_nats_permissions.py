"""The bus's trust boundaries on a real nats-server, configured as `gpupool up` configures it: one nkey identity per
service and per node (deploy/nats/permissions.yaml, libs/devstack/nats_auth.py). Each case is an attack issue #16
found open with the one `agent` user every node shared: a node forging another's telemetry or registering a
phantom, anyone reading every reply on `_INBOX.>`, the agent purging the dead-letter stream."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path

import nats
import pytest

from libs.bus.connection import ensure_streams
from libs.contracts import subjects
from libs.devstack.nats_auth import Identity, IdentityStore, write_config
from libs.devstack.servers import ManagedServer, start_nats
from services.inventory.domain import registration_subject_error

ADMIN_PASSWORD = "admin-secret-for-tests"


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ManagedServer, IdentityStore]]:
    root: Path = tmp_path_factory.mktemp("nats-auth")
    store = IdentityStore(root / "secrets")
    for node in ("node-a", "node-b"):
        store.node("c1", node)
    config = write_config(root / "auth.conf", store.all(), ADMIN_PASSWORD)
    server = start_nats(root / "data", config_file=config)
    try:
        yield server, store
    finally:
        server.stop()


async def connect_as(server: ManagedServer, identity: Identity, errors: list[str]):  # type: ignore[no-untyped-def]
    async def on_error(exc: Exception) -> None:
        errors.append(str(exc))

    return await nats.connect(server.url, nkeys_seed=str(identity.seed_file), inbox_prefix=identity.inbox,
                              error_cb=on_error, allow_reconnect=False)


async def admin(server: ManagedServer):  # type: ignore[no-untyped-def]
    return await nats.connect(server.url, user="admin", password=ADMIN_PASSWORD, allow_reconnect=False)


async def settle(nc) -> None:  # type: ignore[no-untyped-def]
    await nc.flush()
    await asyncio.sleep(0.2)  # permission errors arrive asynchronously after the server read the message


def violated(errors: list[str], subject: str) -> bool:
    return any("permissions violation" in e.lower() and subject.lower() in e.lower() for e in errors)


async def violation(errors: list[str], subject: str, timeout: float = 5.0) -> bool:
    """Whether the server refuses `subject`: its error arrives asynchronously, later on a loaded machine than
    `settle` waits, so wait for it (up to `timeout`) instead of sampling once."""
    deadline = time.monotonic() + timeout
    while not violated(errors, subject):
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.02)
    return True


def identity(store: IdentityStore, name: str) -> Identity:
    return next(i for i in store.all() if i.name == name)


async def test_a_node_publishes_only_its_own_telemetry_events_and_registration(secured) -> None:  # type: ignore[no-untyped-def]
    """Before: a forged sample from one node's credentials quarantined another node's GPU."""
    server, store = secured
    errors: list[str] = []
    nc = await connect_as(server, store.node("c1", "node-a"), errors)
    try:
        own = [subjects.telemetry("c1", "node-a"), subjects.of_node(subjects.AGENT_WORK_STARTED, "c1", "node-a"),
               subjects.register_node("c1", "node-a")]
        for subject in own:
            await nc.publish(subject, b"{}")
        await settle(nc)
        assert errors == []
        other = [subjects.telemetry("c1", "node-b"), subjects.of_node(subjects.AGENT_WORK_EXITED, "c1", "node-b"),
                 subjects.register_node("c1", "node-b"), subjects.register_node("c1", "phantom"),
                 subjects.AGENT_WORK_STARTED, subjects.CMD_INVENTORY_REGISTER_NODE, "gpupool.allocation.granted"]
        for subject in other:
            await nc.publish(subject, b"{}")
            await nc.flush()
            assert await violation(errors, subject), (subject, errors)
        await nc.subscribe(subjects.agent_logs("c1", "node-b"))  # another node's log reads
        await nc.flush()
        assert await violation(errors, subjects.agent_logs("c1", "node-b")), errors
    finally:
        await nc.close()


def test_a_registration_must_name_the_node_whose_subject_it_came_on() -> None:
    """The node's identity may publish only on its own registration subject; inventory then refuses a payload that
    names another node there (a phantom node was registered and given a real job)."""
    from libs.contracts.commands import RegisterNode
    from libs.contracts.events import GpuSpec

    def reg(node: str) -> RegisterNode:
        return RegisterNode(cluster="c1", node=node, hostname=node, cpu_count=1, memory_mib=1,
                            gpus=[GpuSpec(uuid=f"GPU-{node}", index=0, model="H100-80GB", memory_mib=1)])

    assert registration_subject_error(subjects.register_node("c1", "node-a"), reg("node-a")) is None
    refused = registration_subject_error(subjects.register_node("c1", "node-a"), reg("phantom"))
    assert refused is not None and "phantom" in refused


async def test_nobody_reads_another_identitys_replies(secured) -> None:  # type: ignore[no-untyped-def]
    """Before: every service could subscribe to `_INBOX.>` and read every reply and redelivered event."""
    server, store = secured
    for name in ("gateway", "queue", "observer", subjects.node_identity("c1", "node-a")):
        errors: list[str] = []
        nc = await connect_as(server, identity(store, name), errors)
        try:
            await nc.subscribe(f"{subjects.inbox_prefix(name)}.>")
            await settle(nc)
            assert errors == [], (name, errors)
            for foreign in ("_INBOX.>", f"{subjects.inbox_prefix('placement')}.>", ">"):
                await nc.subscribe(foreign)
                await nc.flush()
                assert await violation(errors, foreign), (name, foreign, errors)
        finally:
            await nc.close()


async def test_requests_and_replies_work_through_each_identitys_own_inbox(secured) -> None:  # type: ignore[no-untyped-def]
    server, store = secured
    errors: list[str] = []
    inventory = await connect_as(server, identity(store, "inventory"), errors)
    node = await connect_as(server, store.node("c1", "node-a"), errors)
    try:
        async def answer(msg) -> None:  # type: ignore[no-untyped-def]
            await msg.respond(b'{"ok": true}')  # to the node's inbox: allowed as a response only

        await inventory.subscribe(f"{subjects.CMD_INVENTORY_REGISTER_NODE}.*.*", queue="inventory", cb=answer)
        await inventory.flush()
        reply = await node.request(subjects.register_node("c1", "node-a"), b"{}", timeout=2)
        assert json.loads(reply.data) == {"ok": True}
        await inventory.publish(f"{subjects.inbox_prefix('gateway')}.forged", b"{}")  # not a response
        await inventory.flush()
        assert await violation(errors, f"{subjects.inbox_prefix('gateway')}.forged"), errors
    finally:
        await node.close()
        await inventory.close()


async def test_only_the_supervisor_declares_streams_and_nobody_purges_them(secured) -> None:  # type: ignore[no-untyped-def]
    """Before: every service (and the agent) had STREAM.UPDATE on every stream; the DLQ was purged from 35
    messages to 1 with the agent's credentials."""
    server, store = secured
    errors: list[str] = []
    supervisor = await connect_as(server, store.supervisor(), errors)
    try:
        await ensure_streams(supervisor.jetstream())  # create, then update in place
        await ensure_streams(supervisor.jetstream())
        assert errors == []
        await supervisor.publish("$JS.API.STREAM.PURGE.GPUPOOL_DLQ", b"")
        await supervisor.flush()
        assert await violation(errors, "$JS.API.STREAM.PURGE.GPUPOOL_DLQ")
    finally:
        await supervisor.close()
    for name in ("queue", "placement", "gateway", subjects.node_identity("c1", "node-a"), "observer"):
        errors = []
        nc = await connect_as(server, identity(store, name), errors)
        try:
            await nc.jetstream().stream_info("GPUPOOL_EVENTS") if name != "observer" else None
            for subject in ("$JS.API.STREAM.UPDATE.GPUPOOL_DLQ", "$JS.API.STREAM.PURGE.GPUPOOL_DLQ",
                            "$JS.API.STREAM.DELETE.GPUPOOL_EVENTS", "$JS.API.STREAM.CREATE.MINE",
                            "$JS.API.STREAM.CREATE.GPUPOOL_EVENTS"):
                await nc.publish(subject, b"")
                await nc.flush()
                assert await violation(errors, subject), (name, subject, errors)
        finally:
            await nc.close()


async def test_a_service_uses_only_its_own_consumers(secured) -> None:  # type: ignore[no-untyped-def]
    server, store = secured
    errors: list[str] = []
    queue = await connect_as(server, identity(store, "queue"), errors)
    try:
        for subject in ("$JS.API.CONSUMER.INFO.GPUPOOL_EVENTS.queue", "$JS.API.CONSUMER.MSG.NEXT.GPUPOOL_EVENTS.queue"):
            await queue.publish(subject, b"")
        await settle(queue)
        assert errors == []
        for subject in ("$JS.API.CONSUMER.CREATE.GPUPOOL_EVENTS.placement",
                        "$JS.API.CONSUMER.MSG.NEXT.GPUPOOL_EVENTS.placement",
                        "$JS.API.CONSUMER.DELETE.GPUPOOL_EVENTS.queue", "gpupool.allocation.granted"):
            await queue.publish(subject, b"")
            await queue.flush()
            assert await violation(errors, subject), (subject, errors)
    finally:
        await queue.close()


async def test_the_observer_may_only_listen_to_events(secured) -> None:  # type: ignore[no-untyped-def]
    server, store = secured
    errors: list[str] = []
    observer = await connect_as(server, store.observer(), errors)
    boss = await admin(server)
    try:
        seen: list[str] = []

        async def on_msg(msg) -> None:  # type: ignore[no-untyped-def]
            seen.append(msg.subject)

        await observer.subscribe("gpupool.job.>", cb=on_msg)
        await observer.flush()
        await boss.publish("gpupool.job.submitted", b"{}")
        await boss.flush()
        for _ in range(250):  # a loaded machine may take a while to deliver
            if seen:
                break
            await asyncio.sleep(0.02)
        assert seen == ["gpupool.job.submitted"] and errors == []
        for subject in ("gpupool.cmd.queue.>", "gpupool.query.>"):
            await observer.subscribe(subject)
            await observer.flush()
            assert await violation(errors, subject), (subject, errors)
        await observer.publish("gpupool.job.submitted", b"{}")
        await observer.flush()
        assert await violation(errors, "gpupool.job.submitted")
    finally:
        await boss.close()
        await observer.close()


async def test_the_gateway_may_not_register_nodes(secured) -> None:  # type: ignore[no-untyped-def]
    server, store = secured
    errors: list[str] = []
    gateway = await connect_as(server, identity(store, "gateway"), errors)
    try:
        await gateway.publish(subjects.register_node("c1", "phantom"), b"{}")
        await gateway.flush()
        assert await violation(errors, subjects.register_node("c1", "phantom"))
    finally:
        await gateway.close()


async def test_an_unknown_key_and_a_wrong_password_are_refused(secured, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    server, _ = secured
    stranger = IdentityStore(tmp_path / "elsewhere").observer()  # a well-formed key the server never heard of
    with pytest.raises(Exception) as refused:
        await nats.connect(server.url, nkeys_seed=str(stranger.seed_file), allow_reconnect=False,
                           max_reconnect_attempts=0, connect_timeout=2)
    assert "authorization" in str(refused.value).lower()
    with pytest.raises(Exception) as wrong:  # noqa: PT011 (nats-py raises its own error types here)
        await nats.connect(server.url, user="admin", password="wrong", allow_reconnect=False,
                           max_reconnect_attempts=0, connect_timeout=2)
    assert "authorization" in str(wrong.value).lower()


def test_seeds_are_private_and_a_node_name_cannot_be_taken_twice(secured) -> None:  # type: ignore[no-untyped-def]
    server, store = secured
    for ident in store.all():
        assert ident.seed_file.stat().st_mode & 0o777 == 0o600, ident.name
    assert store.directory.stat().st_mode & 0o777 == 0o700
    assert store.node("c1", "node-a").public_key == store.node("c1", "node-a").public_key  # reused, not re-made
    with pytest.raises(ValueError, match="already belongs"):
        store.node("c1-node", "a")  # would be agent-c1-node-a too


def test_the_monitoring_port_is_off_by_default(secured) -> None:  # type: ignore[no-untyped-def]
    """Before: it answered without authentication and listed users and subscriptions."""
    server, _ = secured
    assert server.monitor_url is None
    assert b"-m" not in Path(f"/proc/{server.pid}/cmdline").read_bytes().split(b"\0")


async def test_gpupool_creds_issues_a_real_nodes_identity_to_a_running_server(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    """A real node gets its own identity with `gpupool creds`; the running server reloads and lets it in."""
    from libs.cli.main import main as cli

    store = IdentityStore(tmp_path / "secrets" / "nats")
    config = write_config(tmp_path / "nats-auth.conf", store.all(), ADMIN_PASSWORD)
    server = start_nats(tmp_path / "nats", config_file=config)
    try:
        (tmp_path / "run.json").write_text(json.dumps({"servers": {"nats": {"pid": server.pid, "url": server.url}}}))
        out = tmp_path / "handed-over" / "gpu-17.nk"
        assert cli(["creds", "--data-dir", str(tmp_path), "--cluster", "dc1", "--node", "gpu-17",
                    "--out", str(out)]) == 0
        printed = capsys.readouterr().out
        assert "reloaded" in printed and f"GPUPOOL_AGENT_NATS_NKEY_FILE={out}" in printed
        assert "GPUPOOL_AGENT_NATS_INBOX_PREFIX=_INBOX_agent-dc1-gpu-17" in printed
        assert out.stat().st_mode & 0o777 == 0o600
        errors: list[str] = []

        async def on_error(exc: Exception) -> None:
            errors.append(str(exc))

        nc = None
        for _ in range(50):  # the reload takes a moment
            try:
                nc = await nats.connect(server.url, nkeys_seed=str(out), inbox_prefix="_INBOX_agent-dc1-gpu-17",
                                        allow_reconnect=False, max_reconnect_attempts=0, connect_timeout=1,
                                        error_cb=on_error)
                break
            except Exception:
                await asyncio.sleep(0.1)
        assert nc is not None, "the issued identity never got in"
        errors.clear()  # attempts made before the reload took effect were refused: that is not what is tested
        try:
            await nc.publish(subjects.telemetry("dc1", "gpu-17"), b"{}")
            await settle(nc)
            assert errors == []
            await nc.publish(subjects.telemetry("dc1", "gpu-18"), b"{}")
            await nc.flush()
            assert await violation(errors, subjects.telemetry("dc1", "gpu-18"))
        finally:
            await nc.close()
        assert cli(["creds", "--data-dir", str(tmp_path), "--identity", "observer"]) == 0
        assert capsys.readouterr().out.strip().endswith("observer.nk")
    finally:
        server.stop()
