"""Per-service NATS credentials on a real nats-server: a service may publish only what it owns and subscribe only
to what it answers or consumes (deploy/nats/permissions.yaml, as `gpupool up` configures it)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import nats
import pytest

from libs.devstack.nats_auth import NatsUser, load_users, write_config
from libs.devstack.servers import ManagedServer, start_nats


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ManagedServer, dict[str, NatsUser]]]:
    root: Path = tmp_path_factory.mktemp("nats-auth")
    users = load_users()
    config = write_config(root / "auth.conf", users, admin_password="admin-secret")
    server = start_nats(root / "data", config_file=config)
    try:
        yield server, {u.name: u for u in users}
    finally:
        server.stop()


async def connect_as(server: ManagedServer, user: NatsUser, errors: list[str]):  # type: ignore[no-untyped-def]
    async def on_error(exc: Exception) -> None:
        errors.append(str(exc))

    return await nats.connect(server.url, user=user.name, password=user.password, error_cb=on_error,
                              allow_reconnect=False)


async def settle(nc) -> None:  # type: ignore[no-untyped-def]
    await nc.flush()
    await asyncio.sleep(0.2)  # permission errors arrive asynchronously after the server read the message


async def test_a_service_may_publish_its_own_events_but_not_another_services(secured) -> None:  # type: ignore[no-untyped-def]
    server, users = secured
    errors: list[str] = []
    nc = await connect_as(server, users["queue"], errors)
    try:
        await nc.publish("gpupool.job.submitted", b"{}")
        await settle(nc)
        assert errors == []
        await nc.publish("gpupool.allocation.granted", b"{}")
        await settle(nc)
        assert any("permissions violation" in e.lower() and "gpupool.allocation.granted" in e for e in errors)
    finally:
        await nc.close()


async def test_a_service_may_not_listen_to_another_services_commands(secured) -> None:  # type: ignore[no-untyped-def]
    server, users = secured
    errors: list[str] = []
    nc = await connect_as(server, users["agent"], errors)
    try:
        await nc.subscribe("gpupool.allocation.>")  # allowed: the simulated agent follows allocations
        await settle(nc)
        assert errors == []
        await nc.subscribe("gpupool.cmd.queue.>")
        await settle(nc)
        assert any("permissions violation" in e.lower() and "gpupool.cmd.queue.>" in e for e in errors)
    finally:
        await nc.close()


async def test_wrong_password_is_refused_and_admin_may_do_anything(secured) -> None:  # type: ignore[no-untyped-def]
    server, users = secured
    with pytest.raises(Exception) as refused:
        await nats.connect(server.url, user="queue", password="wrong", allow_reconnect=False,
                           max_reconnect_attempts=0, connect_timeout=2)
    assert "authorization" in str(refused.value).lower()
    errors: list[str] = []
    admin = await connect_as(server, NatsUser("admin", "admin-secret", (), ()), errors)
    try:
        await admin.subscribe("gpupool.>")
        await admin.publish("gpupool.allocation.granted", b"{}")
        await settle(admin)
        assert errors == []
    finally:
        await admin.close()


def test_every_service_may_publish_its_dead_letters_and_answer_its_own_requests() -> None:
    users = {u.name: u for u in load_users()}
    for name in ("inventory", "queue", "placement", "reclamation", "accounting"):
        assert any(p.startswith("gpupool.dlq.") for p in users[name].publish), name
        assert f"gpupool.query.{name}.>" in users[name].subscribe, name
        assert "_INBOX.>" in users[name].publish, name


async def test_the_jetstream_api_is_granted_call_by_call(secured) -> None:  # type: ignore[no-untyped-def]
    """A service may declare gpupool's streams and use its own consumers; it may not delete or purge a stream,
    create a stream of its own, or create, read or pull another service's consumer."""
    server, users = secured
    errors: list[str] = []
    admin = await connect_as(server, NatsUser("admin", "admin-secret", (), ()), [])
    queue = await connect_as(server, users["queue"], errors)
    try:
        from libs.bus.connection import ensure_streams

        await ensure_streams(admin.jetstream())
        for subject in ("$JS.API.STREAM.INFO.GPUPOOL_EVENTS", "$JS.API.CONSUMER.INFO.GPUPOOL_EVENTS.queue",
                        "$JS.API.CONSUMER.MSG.NEXT.GPUPOOL_EVENTS.queue"):
            await queue.publish(subject, b"")
        await settle(queue)
        assert errors == []
        for subject in ("$JS.API.STREAM.DELETE.GPUPOOL_EVENTS", "$JS.API.STREAM.PURGE.GPUPOOL_EVENTS",
                        "$JS.API.STREAM.CREATE.MINE", "$JS.API.CONSUMER.CREATE.GPUPOOL_EVENTS.placement",
                        "$JS.API.CONSUMER.MSG.NEXT.GPUPOOL_EVENTS.placement", "$JS.API.CONSUMER.DELETE.GPUPOOL_EVENTS.queue"):
            await queue.publish(subject, b"")
            await settle(queue)
            assert any("permissions violation" in e.lower() and subject.lower() in e.lower() for e in errors), \
                (subject, errors)
    finally:
        await queue.close()
        await admin.close()
