"""What `gpupool nats export` writes for Kubernetes works on a real nats-server: the authorization Secret is a
configuration the server enforces, the supervisor's Secret provisions the streams with `gpupool nats provision` (the
Job in deploy/kubernetes/provision.yaml), a service's Secret lets it look the streams up but not change them, and a
node's seed (copied to the node, never in a Secret) speaks only for that node. Before: NATS in Kubernetes and
compose ran without authorization."""

from __future__ import annotations

import asyncio
from pathlib import Path

import nats
import pytest
import yaml
from nats.js.api import StreamConfig

from libs.bus.connection import identity_inbox, wait_for_streams
from libs.cli.main import main as cli
from libs.contracts import subjects
from libs.contracts.subjects import STREAMS
from libs.devstack.servers import start_nats

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def export(tmp_path: Path, *nodes: str) -> tuple[dict[str, dict[str, str]], Path]:
    out = tmp_path / "out"
    args = ["nats", "export", "--target", "kubernetes", "--out", str(out), "--store", str(tmp_path / "store")]
    for node in nodes:
        args += ["--node", node]
    assert cli(args) == 0
    docs = yaml.safe_load_all((out / "nats-secrets.yaml").read_text())
    return {d["metadata"]["name"]: d["stringData"] for d in docs}, out


def seed_file(tmp_path: Path, secrets: dict[str, dict[str, str]], name: str) -> Path:
    """A workload's seed as Kubernetes mounts it from its Secret."""
    path = tmp_path / "mounted" / name / "seed.nk"
    path.parent.mkdir(parents=True)
    path.write_text(secrets[f"nats-identity-{name}"]["seed.nk"])
    return path


async def refused(nc, subject: str, errors: list[str], timeout: float = 5.0) -> bool:  # type: ignore[no-untyped-def]
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not any("permissions violation" in e.lower() and subject.lower() in e.lower() for e in errors):
        if loop.time() > deadline:
            return False
        await asyncio.sleep(0.02)
    return True


async def test_the_kubernetes_export_runs_a_secured_bus(tmp_path: Path) -> None:
    secrets, out = export(tmp_path, "main/gpu-1", "main/gpu-2")
    auth = tmp_path / "auth.conf"
    auth.write_text(secrets["nats-auth"]["auth.conf"])
    server = start_nats(tmp_path / "nats", config_file=auth)
    try:
        # nobody gets in without an identity
        with pytest.raises(Exception):  # noqa: B017 - nats-py raises its own authorization error types
            await nats.connect(server.url, allow_reconnect=False, max_reconnect_attempts=0, connect_timeout=2)

        # the Job: the supervisor provisions every stream
        supervisor = seed_file(tmp_path, secrets, "supervisor")
        rc = await asyncio.to_thread(cli, ["nats", "provision", "--url", server.url, "--nkey-file", str(supervisor),
                                           "--timeout", "30"])
        assert rc == 0

        # a service: its own inbox (derived from its name), the streams looked up, but never changed
        errors: list[str] = []

        async def on_error(exc: Exception) -> None:
            errors.append(str(exc))

        queue_seed = str(seed_file(tmp_path, secrets, "queue"))
        nc = await nats.connect(server.url, nkeys_seed=queue_seed, allow_reconnect=False, error_cb=on_error,
                                inbox_prefix=identity_inbox("queue", None, queue_seed))
        try:
            js = nc.jetstream(timeout=2)
            await wait_for_streams(js, timeout=10)
            assert {(await js.stream_info(s.name)).config.name for s in STREAMS} == {s.name for s in STREAMS}
            with pytest.raises(Exception):  # noqa: B017 - no permission: the request times out or is refused
                await js.add_stream(StreamConfig(name="ROGUE", subjects=["rogue.>"]))
            assert await refused(nc, "$JS.API.STREAM.CREATE.ROGUE", errors), errors
        finally:
            await nc.close()

        # a node: its seed file from nodes/, its own subjects only
        node_errors: list[str] = []

        async def on_node_error(exc: Exception) -> None:
            node_errors.append(str(exc))

        node_seed = str(out / "nodes" / "agent-main-gpu-1.nk")
        node = await nats.connect(server.url, nkeys_seed=node_seed, allow_reconnect=False, error_cb=on_node_error,
                                  inbox_prefix=identity_inbox("agent-main-gpu-1", None, node_seed))
        try:
            await node.publish(subjects.telemetry("main", "gpu-1"), b"{}")
            await node.publish(subjects.telemetry("main", "gpu-2"), b"{}")
            await node.flush()
            assert await refused(node, subjects.telemetry("main", "gpu-2"), node_errors), node_errors
            assert not any(subjects.telemetry("main", "gpu-1") in e for e in node_errors), node_errors
        finally:
            await node.close()
        admin = await nats.connect(server.url, user="admin", password=secrets["nats-auth"]["admin-password"],
                                   allow_reconnect=False)
        try:
            telemetry = await admin.jetstream().stream_info(subjects.TELEMETRY_STREAM.name)
            assert telemetry.state.messages == 1  # its own sample, not the forged one
        finally:
            await admin.close()
    finally:
        server.stop()


def test_exporting_again_with_a_new_node_keeps_every_credential(tmp_path: Path) -> None:
    first, out = export(tmp_path, "main/gpu-1")
    seed = (out / "nodes" / "agent-main-gpu-1.nk").read_text()
    second, out = export(tmp_path, "main/gpu-3")
    for name, data in first.items():
        assert second[name].keys() == data.keys()
        if name != "nats-auth":
            assert second[name] == data, name  # the same seeds: running workloads keep working
    assert first["nats-auth"]["admin-password"] == second["nats-auth"]["admin-password"]
    assert (out / "nodes" / "agent-main-gpu-1.nk").read_text() == seed
    assert (out / "nodes" / "agent-main-gpu-3.nk").exists()
    assert second["nats-auth"]["auth.conf"] != first["nats-auth"]["auth.conf"]  # now lets gpu-3 in too
