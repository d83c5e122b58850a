"""A busy simulated fleet for the dashboard tests and screenshots: two clusters (the `gpupool up` agent's `local`
plus a second real agent process for `eu-west`), quotas, running, idle, pending and approval-waiting jobs of four
teams, finished history, and a few injected GPU faults. Everything goes through the public API and the bus, as a
real deployment would see it."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import nats

MODELS = ("H100-80GB", "A100-80GB", "H200-141GB", "L40S")
# 48 nodes in `local`: 24 H100, 8 of each other model; 16 nodes in `eu-west`: 8 H100, 8 L40S.
LOCAL_FLEET = ";".join(["H100-80GB*8"] * 24 + ["A100-80GB*8"] * 8 + ["H200-141GB*8"] * 8 + ["L40S*8"] * 8)
EU_FLEET = ";".join(["H100-80GB*8"] * 8 + ["L40S*8"] * 8)
LOCAL_NODES, EU_NODES = 48, 16
# dev sessions sit idle (the allocated-but-idle case the pool page highlights); the rest work.
WORKLOADS = "training=training,inference=inference,dev=idle,batch=training"


def start_second_cluster(platform, cluster: str = "eu-west", fleet: str = EU_FLEET,  # type: ignore[no-untyped-def]
                         prefix: str = "eu-node", interval_s: float = 2.0) -> subprocess.Popen:
    """A second simulated agent process reporting to the same bus as another cluster."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPOOL_")}
    env.update({"GPUPOOL_AGENT_NATS_URL": platform.nats_url, "GPUPOOL_AGENT_BACKEND": "sim",
                "GPUPOOL_AGENT_CLUSTER": cluster, "GPUPOOL_AGENT_SIM_FLEET": fleet,
                "GPUPOOL_AGENT_SIM_NODE_PREFIX": prefix, "GPUPOOL_AGENT_SEED": "41",
                "GPUPOOL_AGENT_INTERVAL_S": str(interval_s), "GPUPOOL_AGENT_SIM_WORKLOADS": WORKLOADS,
                "PYTHONUNBUFFERED": "1"})
    log = open(Path(platform.data_dir) / "logs" / f"agent-{cluster}.log", "ab")  # noqa: SIM115
    try:
        return subprocess.Popen([sys.executable, "-m", "services.agent.main"], env=env, stdout=log,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    finally:
        log.close()


def wait_for_nodes(api: httpx.Client, count: int, timeout: float = 90) -> list[dict]:
    deadline = time.monotonic() + timeout
    items: list[dict] = []
    while time.monotonic() < deadline:
        items = api.get("/v1/nodes", params={"limit": 1000}).json().get("items", [])
        if len(items) >= count and all(n["gpus"] and n["gpus"][0]["telemetry"] for n in items):
            return items
        time.sleep(0.5)
    raise AssertionError(f"only {len(items)} of {count} nodes registered with telemetry in {timeout}s")


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=5)


def _submit(api: httpx.Client, **body: object) -> dict:
    response = api.post("/v1/jobs", json=body)
    assert response.status_code == 201, response.text
    return response.json()


def populate(api: httpx.Client) -> dict[str, list[str]]:
    """Quotas, an approval rule and a realistic mix of jobs; returns job ids by purpose."""
    for body in ({"path": "default/research", "gpu_model": "H100-80GB", "guaranteed": 128, "borrowing_limit": 64},
                 {"path": "default/research", "gpu_model": "H200-141GB", "guaranteed": 16, "borrowing_limit": 16},
                 {"path": "default/inference", "gpu_model": "A100-80GB", "guaranteed": 48, "borrowing_limit": 16},
                 {"path": "default/inference", "gpu_model": "H200-141GB", "guaranteed": 24, "borrowing_limit": 8},
                 {"path": "default/platform", "gpu_model": "L40S", "guaranteed": 32, "borrowing_limit": 32},
                 {"path": "default/default", "gpu_model": "*", "guaranteed": 0, "borrowing_limit": 48}):
        assert api.put("/v1/quotas", json=body).status_code == 200
    assert api.put("/v1/approval-rules/gpus_over", json={"value": "32"}).status_code == 200
    since = (datetime.now(UTC) - timedelta(days=1)).isoformat()
    for model, price in (("H100-80GB", 2.49), ("H200-141GB", 3.10), ("A100-80GB", 1.35), ("L40S", 0.85)):
        response = api.put("/v1/cost-rates", json={"gpu_model": model, "price_per_hour": price,
                                                    "effective_from": since})
        assert response.status_code == 200, response.text
    ids: dict[str, list[str]] = {"running": [], "idle": [], "finished": [], "waiting": [], "pending": []}
    for i in range(18):  # research: pre-training and fine-tuning on H100 (most of local's and some of eu-west's)
        ids["running"].append(_submit(api, name=f"llm-ft-{i:02d}", team="research", gpus=8,
                                      gpu_models=["H100-80GB"], kind="training", priority_class="high")["job_id"])
    for i in range(6):
        ids["running"].append(_submit(api, name=f"vision-sweep-{i}", team="research", gpus=4,
                                      gpu_models=["H100-80GB"], kind="batch")["job_id"])
    ids["running"].append(_submit(api, name="chat-api", team="inference", gpus=1, replicas=24,
                                  gpu_models=["A100-80GB"], kind="inference",
                                  priority_class="production-inference")["job_id"])
    ids["running"].append(_submit(api, name="embed-api", team="inference", gpus=2, replicas=12,
                                  gpu_models=["H200-141GB"], kind="inference",
                                  priority_class="production-inference")["job_id"])
    for i in range(10):  # platform's notebooks: allocated, mostly idle
        ids["idle"].append(_submit(api, name=f"notebook-{i}", team="platform", gpus=1 + i % 2,
                                   gpu_models=["L40S"], kind="dev")["job_id"])
    for i in range(4):
        ids["running"].append(_submit(api, name=f"eval-{i}", team="default", gpus=2, gpu_models=["L40S"],
                                      kind="batch", priority_class="low")["job_id"])
    for i in range(3):  # short jobs that finish: history
        ids["finished"].append(_submit(api, name=f"smoke-{i}", team="research", gpus=1, kind="batch")["job_id"])
    ids["waiting"].append(_submit(api, name="pretrain-70b", team="research", gpus=64, gang_nodes=8,
                                  gpus_per_node=8, gpu_models=["H100-80GB"], kind="training")["job_id"])
    ids["waiting"].append(_submit(api, name="batch-backfill", team="inference", gpus=40, gang_nodes=5,
                                  gpus_per_node=8, kind="batch")["job_id"])
    for i in range(6):  # more H200 than there is: they queue with a reason
        ids["pending"].append(_submit(api, name=f"h200-train-{i}", team="research", gpus=8,
                                      gpu_models=["H200-141GB"], kind="training")["job_id"])
    ids["pending"].append(_submit(api, name="a100-burst", team="default", gpus=8, gpu_models=["A100-80GB"],
                                  kind="batch", priority_class="best-effort")["job_id"])
    _wait_states(api, ids["finished"], {"running"})
    for job_id in ids["finished"][:2]:
        api.post(f"/v1/jobs/{job_id}/complete")
    api.post(f"/v1/jobs/{ids['finished'][2]}/cancel", json={"reason": "wrong dataset"})
    return ids


def _wait_states(api: httpx.Client, job_ids: list[str], states: set[str], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all(api.get(f"/v1/jobs/{j}").json()["state"] in states for j in job_ids):
            return
        time.sleep(0.2)
    raise AssertionError(f"jobs {job_ids} did not reach {states}")


async def publish_faults(url: str, faults: list[dict]) -> None:
    nc = await nats.connect(url)
    try:
        for fault in faults:
            await nc.publish("gpupool.sim.fault", json.dumps(fault).encode())
        await nc.flush()
    finally:
        await nc.close()


def send_faults(nats_url: str, faults: list[dict]) -> None:
    """Publish from a worker thread: Playwright's sync API keeps an event loop running in the test's thread."""
    errors: list[BaseException] = []

    def run() -> None:
        try:
            asyncio.run(publish_faults(nats_url, faults))
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
            errors.append(exc)

    worker = threading.Thread(target=run, name="send-faults")
    worker.start()
    worker.join(timeout=30)
    if errors:
        raise errors[0]


def inject_faults(nats_url: str) -> None:
    """A fallen-off-the-bus GPU, an uncorrectable ECC error and an overheating one (simulated agents only)."""
    send_faults(nats_url, [{"node": "sim-node-40", "gpu": 3, "fault": "xid79"},
                                   {"node": "sim-node-44", "gpu": 6, "fault": "dbe"},
                                   {"node": "eu-node-12", "gpu": 1, "fault": "thermal"}])
