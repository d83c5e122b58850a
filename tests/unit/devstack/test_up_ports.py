"""`gpupool up` binds every process's HTTP port itself and hands the socket down (HTTP_FD), so no two processes
share a port and nothing else can take one between its choice and the bind.

Before: the supervisor asked the kernel for a free port per process, closed it, and let each child bind it later.
The kernel handed one port out twice in about 1 of 400 starts of nine processes; when the gateway drew a port a
service already held, the gateway died on `address in use`, the readiness probe reached the service instead, and
run.json sent every API call to the service's ops endpoint: the fleet registered, but `/v1/nodes` answered 404 for
good (the fresh machine's "fleet did not register in 60s", issue #16).
"""

from __future__ import annotations

import asyncio
import socket
import urllib.request
from pathlib import Path

import pytest

from libs.devstack import servers
from libs.devstack import stack as devstack
from libs.runtime.http import OpsEndpoint
from tests.unit.devstack.stacks import processes, started


def test_every_process_gets_its_own_bound_port_even_when_the_kernel_repeats_one(tmp_path: Path) -> None:
    mp = pytest.MonkeyPatch()
    taken = servers.free_port()
    worst = lambda host="127.0.0.1": taken  # noqa: E731 - the kernel's worst case: one port for every pick
    mp.setattr(servers, "free_port", worst)
    mp.setattr(devstack, "free_port", worst, raising=False)  # where the supervisor picked ports before
    try:
        st = started(tmp_path, mp)
    finally:
        mp.undo()
    try:
        ports = [int(p.http_url.rsplit(":", 1)[1]) for p in st.processes]
        assert len(ports) == len(set(ports)) == len(st.processes) == 8
        for p, port in zip(st.processes, ports, strict=True):
            assert p.listener is not None and p.listener.getsockname()[1] == port, p.name
            prefix = "GPUPOOL_" + p.name.upper() + "_"
            assert p.env[prefix + "HTTP_FD"] == str(p.listener.fileno()), p.name
            with pytest.raises(OSError):  # held: nobody else can bind it
                socket.create_server(("127.0.0.1", port))
        assert st.gateway_url.endswith(f":{ports[[p.name for p in st.processes].index('gateway')]}")
    finally:
        for p in st.processes:
            p.close_listener()


def test_a_gateway_port_already_in_use_fails_the_start_with_a_clear_error(tmp_path: Path) -> None:
    busy = socket.create_server(("127.0.0.1", 0))
    mp = pytest.MonkeyPatch()
    try:
        opts = devstack.StackOptions(data_dir=tmp_path, gateway_port=busy.getsockname()[1])
        st = devstack.Stack(opts)
        st.nats_url, st.admin_dsn, st.admin_token = "nats://x:4222", "postgresql://x/postgres", "gpt_" + "x" * 40
        mp.setattr(devstack.ServiceProcess, "start", lambda self: None)
        with pytest.raises(RuntimeError, match="cannot be bound"):
            st._start_services(say=lambda *_: None)
        for p in st.processes:
            p.close_listener()
    finally:
        mp.undo()
        busy.close()


async def test_the_ops_endpoint_serves_on_an_inherited_socket() -> None:
    listener = servers.listen_socket()
    port = listener.getsockname()[1]

    async def ready() -> bool:
        return True

    ops = OpsEndpoint("127.0.0.1", 0, ready, fd=listener.fileno())
    assert await ops.start() == port
    try:
        body = await asyncio.to_thread(lambda: urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5)
                                       .read())
        assert body == b'{"status":"ready"}'
    finally:
        await ops.stop()


def test_the_otlp_flag_turns_export_on_for_every_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`gpupool up --otlp-endpoint URL`: each service, the gateway and the agent get the SDK's endpoint setting."""
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_ENDPOINT", raising=False)
    with processes(tmp_path / "off", monkeypatch) as off:
        assert all("OTEL_EXPORTER_OTLP_ENDPOINT" not in p.env for p in off.values())
    with processes(tmp_path / "on", monkeypatch, otlp_endpoint="http://collector:4318") as on:
        assert {"gateway", "agent", "queue", "placement"} <= set(on)
        assert {p.env.get("OTEL_EXPORTER_OTLP_ENDPOINT") for p in on.values()} == {"http://collector:4318"}
    from libs.cli.main import build_parser
    args = build_parser().parse_args(["up", "--otlp-endpoint", "http://collector:4318"])
    assert args.otlp_endpoint == "http://collector:4318"
