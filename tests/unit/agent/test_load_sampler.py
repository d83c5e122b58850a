"""What an agent samples from each replica for its job's autoscaler: the GPUs' mean utilisation from the node's
last telemetry sample, or a Prometheus metric scraped over real HTTP from the replica's port; when each probe is
due; and which samples are skipped (none to take, an unanswered scrape, an out-of-bounds value)."""

from __future__ import annotations

import asyncio
import socket
from datetime import UTC, datetime

import pytest

from libs.contracts.events import AllocatedGpu, AllocationGranted, WorkLoadSampled
from libs.contracts.work import LoadProbe, WorkSpec
from services.agent.domain import metric_value, replica_utilization
from services.agent.load import LoadSampler
from services.agent.nvml_types import GpuSample

EXPOSITION = """# HELP requests_in_flight requests being served
# TYPE requests_in_flight gauge
requests_in_flight{model="a",replica="0"} 3
requests_in_flight{model="b"} 4.5 1712345678000
requests_in_flight_total 100
other_requests_in_flight 7
requests_in_flight NaN
"""


def test_a_metric_is_the_sum_of_its_series_and_nothing_else() -> None:
    assert metric_value(EXPOSITION, "requests_in_flight") == 7.5
    assert metric_value(EXPOSITION, "requests_in_flight_total") == 100
    assert metric_value(EXPOSITION, "missing") is None
    assert metric_value("requests_in_flight NaN\n", "requests_in_flight") is None
    assert metric_value("vllm:num_requests_running 2\n", "vllm:num_requests_running") == 2


def test_a_replicas_utilisation_is_its_gpus_mean_or_nothing() -> None:
    util = {"GPU-a": 90.0, "GPU-b": 30.0, "GPU-mig": None}
    assert replica_utilization(["GPU-a", "GPU-b"], util) == 60.0
    assert replica_utilization(["GPU-a", "GPU-mig"], util) is None  # a MIG-mode GPU reports no utilisation
    assert replica_utilization(["GPU-unsampled"], util) is None
    assert replica_utilization([], util) is None


def grant(allocation_id: str, probe: LoadProbe, gpus: tuple[str, ...] = ("GPU-a",), replica: int = 0) -> AllocationGranted:
    work = WorkSpec(command=["server"], ports=["http"], load=probe)
    return AllocationGranted(
        allocation_id=allocation_id, job_id="job-1", team="t", project="p", cluster="c", node="n",
        gpus=[AllocatedGpu(uuid=u, index=i, model="H100-80GB") for i, u in enumerate(gpus)],
        granted_at=datetime.now(UTC), work=work, replica=replica)


def sample(uuid: str, util: float | None) -> GpuSample:
    return GpuSample(uuid=uuid, index=0, timestamp=0.0, utilization_gpu_pct=util, utilization_memory_pct=None,
                     memory_used_mib=0, memory_total_mib=81_559, temperature_c=None, power_w=None, sm_clock_mhz=None,
                     ecc_volatile_sbe=0, ecc_volatile_dbe=0, retired_pages_pending=False, xid_events=(),
                     throttle_reasons=(), process_count=0, health="healthy")


class Published(list):
    async def __call__(self, event, identity: str) -> bool:  # type: ignore[no-untyped-def]
        self.append(event)
        return True


async def test_gpu_utilisation_is_sampled_every_interval_from_the_last_telemetry() -> None:
    published = Published()
    sampler = LoadSampler("c", "n", "127.0.0.1", published)
    gpu = grant("a-1", LoadProbe(signal="gpu_utilization", every_s=5), gpus=("GPU-a", "GPU-b"), replica=1)
    assert await sampler.tick([(gpu, {})], now=100.0) == 0  # no telemetry yet: nothing to say
    sampler.observe([sample("GPU-a", 80.0), sample("GPU-b", 40.0)])
    assert await sampler.tick([(gpu, {})], now=104.0) == 0  # not due before 105
    assert await sampler.tick([(gpu, {})], now=105.0) == 1
    event = published[-1]
    assert isinstance(event, WorkLoadSampled) and (event.signal, event.value, event.replica) == (
        "gpu_utilization", 60.0, 1)
    assert (event.allocation_id, event.job_id, event.node) == ("a-1", "job-1", "n")
    sampler.forget("a-1")
    assert await sampler.tick([(gpu, {})], now=106.0) == 1  # forgotten: due at once again


class MetricsServer:
    def __init__(self) -> None:
        self.body, self.status = EXPOSITION, 200

    async def __aenter__(self) -> int:
        async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            request = await reader.readline()
            while (await reader.readline()).strip():
                pass
            assert request.startswith(b"GET /custom/metrics HTTP/1.0")
            body = self.body.encode()
            writer.write(f"HTTP/1.0 {self.status} X\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)
            await writer.drain()
            writer.close()

        self.server = await asyncio.start_server(answer, "127.0.0.1", 0)
        return self.server.sockets[0].getsockname()[1]

    async def __aexit__(self, *exc: object) -> None:
        self.server.close()
        await self.server.wait_closed()


@pytest.mark.parametrize("body,status,expected", [
    (EXPOSITION, 200, 7.5),
    (EXPOSITION, 503, None),  # not answering 200: no sample
    ("requests_in_flight -3\n", 200, None),  # a negative load is not one
    ("requests_in_flight 1e13\n", 200, None),  # beyond the event's bound
])
async def test_a_metric_is_scraped_from_the_replicas_port(body: str, status: int, expected: float | None) -> None:
    published = Published()
    sampler = LoadSampler("c", "n", "127.0.0.1", published)
    probe = LoadProbe(signal="metric", every_s=1, metric="requests_in_flight", port="http", path="/custom/metrics")
    server = MetricsServer()
    server.body, server.status = body, status
    async with server as port:
        sent = await sampler.tick([(grant("a-2", probe), {"http": port})], now=1.0)
    assert sent == (0 if expected is None else 1)
    if expected is not None:
        assert published[-1].signal == "metric" and published[-1].value == expected


async def test_a_replica_without_its_port_or_not_listening_is_skipped() -> None:
    sampler = LoadSampler("c", "n", "127.0.0.1", Published())
    probe = LoadProbe(signal="metric", every_s=1, metric="requests_in_flight", port="http")
    assert await sampler.tick([(grant("a-3", probe), {})], now=1.0) == 0
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    assert await sampler.tick([(grant("a-4", probe), {"http": closed})], now=1.0) == 0
