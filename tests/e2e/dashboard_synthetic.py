"""Synthetic API answers for the 512 nodes × 8 GPUs rendering test: the page runs its real code (fetch, model,
canvas) against documents shaped like the gateway's, served by a Playwright route instead of 512 simulated agents
(which two CI cores could not run beside the platform). Each call moves utilization, so every update repaints."""

from __future__ import annotations

import json
import random
from datetime import UTC, datetime

MODELS = ("H100-80GB", "A100-80GB", "H200-141GB", "L40S")
TEAMS = ("research", "inference", "platform", "default", "vision", "speech")


class SyntheticPool:
    def __init__(self, clusters: int = 4, nodes: int = 512, gpus: int = 8, seed: int = 11) -> None:
        rng = random.Random(seed)
        self.calls = 0
        self.last_size = 0
        self.nodes = []
        self.allocations = []
        now = datetime.now(UTC).isoformat()
        per_cluster = nodes // clusters
        for i in range(nodes):
            cluster = f"dc-{i // per_cluster + 1}"
            model = MODELS[(i // 16) % len(MODELS)]
            gpu_list = [{"uuid": f"GPU-{i:04d}-{g}", "index": g, "model": model, "name": f"NVIDIA {model}",
                         "memory_mib": 81559, "health": "failed" if rng.random() < 0.004 else "healthy",
                         "health_reasons": [], "state": "healthy", "sharing": "exclusive", "telemetry": None}
                        for g in range(gpus)]
            self.nodes.append({"cluster": cluster, "node": f"node-{i:04d}", "hostname": f"node-{i:04d}",
                               "cpu_count": 224, "memory_mib": 2097152, "driver_version": "550.90.07",
                               "agent_version": "0.1.0", "labels": {}, "state": "lost" if i == 77 else "ready",
                               "registered_at": now, "last_seen_at": now, "cordoned": i == 130, "drained": False,
                               "gpus": gpu_list})
            g = 0
            while g < gpus:  # allocations of 1, 2, 4 or 8 GPUs over ~70% of the fleet
                size = rng.choice((1, 2, 4, 8))
                if g + size > gpus:
                    size = gpus - g
                if rng.random() < 0.7:
                    self.allocations.append({
                        "allocation_id": f"a-{i}-{g}", "job_id": f"j-{i}-{g}", "replica": 0,
                        "team": rng.choice(TEAMS), "project": "default", "cluster": cluster, "node": f"node-{i:04d}",
                        "granted_at": now, "released_at": None,
                        "gpus": [{"uuid": f"GPU-{i:04d}-{k}", "index": k, "model": model} for k in range(g, g + size)]})
                g += size
        self.held = {gpu["uuid"] for a in self.allocations for gpu in a["gpus"]}
        self.idle = {uuid for uuid in sorted(self.held) if rng.random() < 0.1}  # held but doing nothing
        self.rng = rng

    def nodes_doc(self) -> bytes:
        """Every call is a new telemetry sample: held GPUs work (a few idle), free ones rest."""
        self.calls += 1
        rng = self.rng
        now = datetime.now(UTC).isoformat()
        for node in self.nodes:
            for gpu in node["gpus"]:
                busy = gpu["uuid"] in self.held and gpu["uuid"] not in self.idle
                util = min(100.0, max(0.0, rng.gauss(82, 12))) if busy else rng.random() * 2
                gpu["telemetry"] = {"sampled_at": now, "utilization_gpu_pct": round(util, 1),
                                    "utilization_memory_pct": round(util * 0.6, 1),
                                    "memory_used_mib": int(81559 * (0.3 + 0.6 * util / 100)) if busy else 0,
                                    "temperature_c": round(35 + util * 0.45, 1), "power_w": round(80 + util * 6, 1),
                                    "ecc_volatile_sbe": 0, "ecc_volatile_dbe": 0, "xid_last": None,
                                    "process_count": 1 if busy else 0}
        body = json.dumps({"items": self.nodes, "next": None}).encode()
        self.last_size = len(body)
        return body

    def pool_doc(self) -> bytes:
        models = {}
        for node in self.nodes:
            for gpu in node["gpus"]:
                m = models.setdefault(gpu["model"], {"model": gpu["model"], "total": 0, "healthy": 0, "unhealthy": 0,
                                                     "on_lost_nodes": 0, "in_use": 0, "allocated": 0,
                                                     "allocated_idle": 0, "free": 0})
                m["total"] += 1
                m["healthy" if gpu["health"] == "healthy" else "unhealthy"] += 1
                if gpu["uuid"] in self.held:
                    m["allocated"] += 1
                elif gpu["health"] == "healthy":
                    m["free"] += 1
        rows = [models[k] for k in sorted(models)]
        totals = {k: sum(r[k] for r in rows) for k in rows[0] if k != "model"}
        return json.dumps({"clusters": [], "all": {"models": rows, "totals": totals}, "in_use_util_pct": 5.0,
                           "fresh_within_s": 15.0}).encode()

    def answer(self, path: str) -> tuple[int, bytes]:
        if path == "/v1/whoami":
            return 200, json.dumps({"subject": "bench", "role": "platform-admin", "team": None, "via": "token",
                                    "allowed": ["pool.read", "job.read", "team.read"]}).encode()
        if path == "/v1/nodes":
            return 200, self.nodes_doc()
        if path == "/v1/allocations":
            return 200, json.dumps({"items": self.allocations, "next": None}).encode()
        if path == "/v1/pool":
            return 200, self.pool_doc()
        if path == "/v1/teams":
            return 200, json.dumps({"items": [{"team": t, "org": "default", "quotas": []} for t in TEAMS],
                                    "next": None}).encode()
        if path in ("/v1/reclamation/tracked", "/v1/jobs"):
            return 200, b'{"items": [], "next": null}'
        return 404, json.dumps({"type": "about:blank", "title": "Not Found", "status": 404, "detail": "synthetic",
                                "reason": "NotFound"}).encode()
