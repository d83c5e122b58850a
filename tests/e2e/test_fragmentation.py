"""Live fragmentation on a running platform: free GPUs that no recently asked-for job shape could use, per cluster
and model, through the API and placement's gauges."""

from __future__ import annotations

import re

import httpx
import pytest
from support import AllocationWatcher, complete, eventually, finish_all, submit

from libs.cli.main import main
from libs.contracts.events import AllocationGranted, AllocationReleased

pytestmark = pytest.mark.e2e
FLEET_NODES = 2
UP_ARGS = ["--fleet", "H100-80GB*8;H100-80GB*8", "--env", "placement:FRAGMENTATION_INTERVAL_S=1"]


def _gauge(platform, name: str) -> float | None:  # type: ignore[no-untyped-def]
    text = httpx.get(platform.reload()["services"]["placement"]["url"] + "/metrics", timeout=5).text
    found = [float(v) for v in re.findall(rf'^{name}{{[^}}]*gpu_model="H100-80GB"[^}}]*}} (\S+)$', text, re.M)]
    return sum(found) if found else None


async def test_free_gpus_a_recent_shape_cannot_use_are_reported_as_fragmented(platform, capsys) -> None:  # type: ignore[no-untyped-def]
    async with AllocationWatcher(platform.nats_url) as watcher:
        with platform.client() as api:
            finish_all(api)
            whole = submit(api, "whole-node", "research", 8)  # the recent workload: one 8-GPU job ...
            await watcher.wait_for(AllocationGranted, whole)
            complete(api, whole)
            await watcher.wait_for(AllocationReleased, whole)
            nodes = []
            for i in range(2):  # ... and two 1-GPU jobs, which stay
                job = submit(api, f"single-{i}", "research", 1)
                _, _, granted = await watcher.wait_for(AllocationGranted, job)
                nodes.append(granted.node)

            doc = api.get("/v1/pool/fragmentation").json()
            assert {(w["gpus"], w["gpu_milli"]): w["share"] for w in doc["workload"]} == {
                (8, 1000): pytest.approx(1 / 3, abs=1e-4), (1, 1000): pytest.approx(2 / 3, abs=1e-4)}
            [row] = doc["rows"]
            assert (row["gpus"], row["free_gpus"]) == (16, 14.0)
            # a node with any GPU taken cannot take the 8-GPU shape (a third of the workload): a third of its free
            # GPUs is lost; an untouched node loses nothing
            expected = sum((8 - nodes.count(n)) / 3 for n in set(nodes))
            assert row["fragmented_gpus"] == pytest.approx(expected, abs=1e-3)
            assert row["fragmented_share"] == pytest.approx(expected / 14, abs=1e-3)
            assert api.get("/v1/pool/fragmentation", params={"cluster": "no-such"}).json()["rows"] == []
            assert api.get("/v1/pool/fragmentation", params={"cluster": "x" * 64}).status_code == 422

            code = main(["pool", "--fragmentation", "--url", platform.gateway, "--token", platform.run["admin_token"]])
            out = capsys.readouterr().out
            assert code == 0
            assert re.search(rf"^{row['cluster']}\s+H100-80GB\s+16\s+14\s+{expected:.2f}\s+", out, re.M), out
            assert "recent workload: 1 GPU 67%, 8 GPUs 33%" in out, out

            assert eventually(lambda: _gauge(platform, "gpupool_pool_fragmented_gpus") == pytest.approx(
                expected, abs=1e-3), "placement's fragmentation gauge", timeout=15)
            assert _gauge(platform, "gpupool_pool_free_gpus") == pytest.approx(14.0)
            finish_all(api)
