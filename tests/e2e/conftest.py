"""The platform as real processes: `gpupool up` against the session's NATS and PostgreSQL (a fresh database
prefix and empty streams), torn down with SIGTERM exactly as Ctrl-C would."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import nats
import pytest


async def _delete_streams(url: str) -> None:
    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        for info in await js.streams_info():
            await js.delete_stream(info.config.name)
    finally:
        await nc.close()


class Platform:
    def __init__(self, proc: subprocess.Popen, data_dir: Path, run: dict) -> None:
        self.proc = proc
        self.data_dir = data_dir
        self.run = run

    @property
    def gateway(self) -> str:
        return self.run["gateway_url"]

    @property
    def nats_url(self) -> str:
        return self.run["nats_url"]

    def client(self) -> httpx.Client:
        return httpx.Client(base_url=self.gateway, timeout=10,
                            headers={"Authorization": f"Bearer {self.run['admin_token']}"})

    def reload(self) -> dict:
        self.run = json.loads((self.data_dir / "run.json").read_text())
        return self.run

    def pid(self, service: str) -> int:
        return int(self.reload()["services"][service]["pid"])

    def log(self, service: str) -> str:
        return (self.data_dir / "logs" / f"{service}.log").read_text(errors="replace")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):  # type: ignore[no-untyped-def]
    """A failed e2e test reports what the platform's services logged above info, and their last lines: the
    platform's data directory is gone by the time anyone reads a CI log."""
    outcome = yield
    report = outcome.get_result()
    platform = getattr(item, "funcargs", {}).get("platform")
    if report.when != "call" or not report.failed or not isinstance(platform, Platform):
        return
    for service in ("placement", "queue", "gateway"):
        try:
            lines = platform.log(service).splitlines()
        except OSError:
            continue
        notable = [line for line in lines if '"level": "info"' not in line][-15:]
        report.sections.append((f"{service} log: warnings and errors (last 15), then the last 8 lines",
                                "\n".join(line[:400] for line in notable + ["..."] + lines[-8:])))


@pytest.fixture(scope="module")
def platform(request: pytest.FixtureRequest, nats_url: str, pg_admin_dsn: str,
             tmp_path_factory: pytest.TempPathFactory) -> Iterator[Platform]:
    """One `gpupool up` per test module; a module may set UP_ARGS (e.g. ["--placement-replicas", "2"])."""
    asyncio.run(_delete_streams(nats_url))
    data_dir = tmp_path_factory.mktemp("gpupool-up")
    env = {**os.environ, "GPUPOOL_NATS_URL": nats_url, "GPUPOOL_DATABASE_URL": pg_admin_dsn,
           "GPUPOOL_DATABASE_PREFIX": f"e2e_{uuid.uuid4().hex[:8]}"}
    out = open(data_dir / "up.out", "wb")  # noqa: SIM115
    proc = subprocess.Popen(
        [sys.executable, "-m", "libs.cli.main", "up", "--port", "0", "--data-dir", str(data_dir),
         "--telemetry-interval", "0.5", *getattr(request.module, "UP_ARGS", [])],
        env=env, stdout=out, stderr=subprocess.STDOUT)
    run_file = data_dir / "run.json"
    deadline = time.monotonic() + 120
    while not run_file.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"gpupool up did not start:\n{(data_dir / 'up.out').read_text()}")
        time.sleep(0.2)
    platform = Platform(proc, data_dir, json.loads(run_file.read_text()))
    try:
        _wait_for_fleet(platform, nodes=getattr(request.module, "FLEET_NODES", 4))
        yield platform
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
        out.close()


def _wait_for_fleet(platform: Platform, nodes: int = 4, timeout: float = 60) -> None:
    """Ready means every simulated node registered and its telemetry reached inventory."""
    deadline = time.monotonic() + timeout
    items: list[dict] = []
    with platform.client() as api:
        while time.monotonic() < deadline:
            items = api.get("/v1/nodes").json().get("items", [])
            if len(items) >= nodes and all(n["gpus"] and n["gpus"][0]["telemetry"] for n in items):
                return
            time.sleep(0.2)
    seen = {f"{n['cluster']}/{n['node']}": bool(n["gpus"] and n["gpus"][0]["telemetry"]) for n in items}
    raise AssertionError(f"fleet did not register in {timeout}s: nodes (telemetry?) {seen}\n"
                         f"{asyncio.run(_telemetry_path(platform.nats_url))}\n"
                         f"inventory's warnings:\n{_notable(platform, 'inventory')}\n"
                         f"agent log:\n{platform.log('agent')[-3000:]}")


async def _telemetry_path(url: str) -> str:
    """Where the samples stopped, for a failure report: stored by JetStream? delivered to inventory? acked?"""
    try:
        nc = await nats.connect(url, connect_timeout=2, allow_reconnect=False)
    except Exception as exc:  # noqa: BLE001 - a report, never a second failure
        return f"NATS unreachable: {exc!r}"
    try:
        js = nc.jetstream(timeout=2)
        out = []
        for stream, durable in (("GPUPOOL_TELEMETRY", "inventory-telemetry"), ("GPUPOOL_DLQ", None)):
            try:
                state = (await js.stream_info(stream)).state
                out.append(f"{stream}: {state.messages} messages, seq {state.first_seq}..{state.last_seq}")
                if durable:
                    c = await js.consumer_info(stream, durable)
                    out.append(f"  consumer {durable}: delivered up to {c.delivered.stream_seq}, acked up to "
                               f"{c.ack_floor.stream_seq}, pending {c.num_pending}, ack pending {c.num_ack_pending}, "
                               f"redelivered {c.num_redelivered}, waiting pulls {c.num_waiting}")
            except Exception as exc:  # noqa: BLE001
                out.append(f"{stream}/{durable}: {exc!r}")
        return "\n".join(out)
    finally:
        await nc.close()


def _notable(platform: Platform, service: str, last: int = 20) -> str:
    try:
        lines = platform.log(service).splitlines()
    except OSError as exc:
        return repr(exc)
    return "\n".join(line[:400] for line in [x for x in lines if '"level": "info"' not in x][-last:])
