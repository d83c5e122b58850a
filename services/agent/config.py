"""Agent settings (env prefix GPUPOOL_AGENT_)."""

from __future__ import annotations

import socket
from typing import Any, Literal

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from libs.contracts.addresses import peer_address
from libs.contracts.fleet import DEFAULT_SIM_FLEET, parse_fleet, parse_fleet_nodes  # noqa: F401
from libs.contracts.labels import parse_labels

# `gpupool up`'s default simulated fleet: 4 nodes × 8 GPUs of mixed models.


class AgentSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="GPUPOOL_AGENT_", extra="ignore")

    nats_url: str = "nats://127.0.0.1:4222"
    nats_user: str | None = None
    nats_password: str | None = None
    nats_nkey_file: str | None = Field(default=None, description="this identity's nkey seed file (.nk): NATS nkey "
                                       "authentication instead of user and password")
    nats_inbox_prefix: str | None = Field(default=None, pattern=r"^_INBOX[A-Za-z0-9_-]*$",
                                          description="where replies to this identity arrive; the server lets it "
                                                      "subscribe only there (`_INBOX_<identity>`)")
    nats_credentials_dir: str | None = Field(default=None, description="a simulated fleet's identities: each node "
                                             "connects with <dir>/agent-<cluster>-<node>.nk (gpupool up)")
    declare_streams: bool = Field(default=True, description="create or update the JetStream streams at start; "
                                  "false where a provisioning identity does (the service only waits for them)")
    address: str = Field(default="", max_length=253,
                         description="Where this node's peers reach it (a gang's rendezvous): an IP or host name; "
                                     "default: the local address on the route to NATS (the real backend), "
                                     "127.0.0.<2+i> for simulated node i")

    @field_validator("address")
    @classmethod
    def _address(cls, value: str) -> str:
        return peer_address(value)
    cluster: str = "local"
    node: str = Field(default_factory=socket.gethostname, description="Node name (real backend)")
    backend: Literal["real", "sim"] = "real"
    sim_fleet: str = Field(default=DEFAULT_SIM_FLEET,
                           description="Simulated nodes separated by ';', each 'MODEL*COUNT[,MODEL*COUNT]"
                                       "[@OPTION,...]' (options rack=, block=, numa=, nvlink=all|pairs|none, "
                                       "labels: libs/contracts/fleet.py)")
    labels: str = Field(default="", max_length=4096,
                        description="The node's labels, 'KEY=VALUE,...' (Kubernetes label syntax): jobs' "
                                    "node_selector matches them, and its place in the network, e.g. "
                                    "'topology.gpupool.io/rack=r12,topology.gpupool.io/block=b3' (placement packs a "
                                    "gang into one rack, then one block); a simulated node's fleet options add to "
                                    "them")

    @field_validator("labels", "sim_fleet")
    @classmethod
    def _well_formed(cls, value: str, info: Any) -> str:
        if info.field_name == "labels":
            parse_labels(value)
        else:
            parse_fleet_nodes(value)
        return value
    sim_node_prefix: str = "sim-node"
    seed: int = 7
    sim_workloads: str = Field(default="training=training,inference=inference,dev=dev,batch=training",
                               description="Simulated load per job kind on allocated GPUs (kind=workload,...)")
    sim_mig: str = Field(default="", description="Simulated GPU models that start in MIG mode (comma-separated)")

    interval_s: float = Field(default=1.0, gt=0, description="Seconds between telemetry samples")
    heartbeat_s: float = Field(default=5.0, ge=0, le=3600, description=(
        "Sampling by change: a node's sample is sent only when some GPU moved beyond the deadband below (or its "
        "health, Xids, ECC counters, throttling or process count changed), or this long after the last one sent "
        "(keep it under inventory's NODE_LOST_AFTER_S / 2 and ROLLUP_LATE_S); 0: every sample is sent"))
    deadband_util_pct: float = Field(default=5.0, ge=0, le=100, description="GPU or memory-bandwidth "
                                     "utilisation change (points) that is sent at once")
    deadband_memory_mib: float = Field(default=512.0, ge=0, description="Framebuffer use change (MiB) sent at once")
    deadband_temperature_c: float = Field(default=3.0, ge=0, description="Temperature change (°C) sent at once")
    deadband_power_w: float = Field(default=25.0, ge=0, description="Power draw change (W) sent at once")
    sim_background: str = Field(default="", pattern=r"^([a-z]+=[0-9.]+)?(,[a-z]+=[0-9.]+)*$", description=(
        "Simulated load on GPUs no allocation holds, as shares of the fleet's GPUs, e.g. "
        "'training=0.4,inference=0.3,dev=0.2' (the rest stay free): a load test's fleet looks like a busy one"))
    buffer_mib: int = Field(default=32, ge=1, le=4096, description="Telemetry kept through a bus outage (MiB, "
                                                                     "the oldest dropped beyond it)")
    fraction_policy: Literal["auto", "report", "stop"] = Field(
        default="auto", description="A process over its fraction's memory: report it, or stop it too (the work "
                                    "ends failed FractionMemoryExceeded); auto: stop dev work, report the rest")
    fraction_stop_grace_s: float = Field(default=10.0, ge=0, description="SIGTERM → SIGKILL grace when stopping")
    apply_mig: bool = Field(default=True, description="Create/destroy MIG instances as allocations come and go")
    storage_paths: str = Field(default="/", description="Volumes the node reports (real backend): mount paths, "
                                                        "comma-separated, e.g. '/,/scratch,/data'")
    run_work: bool = Field(default=True, description="Launch jobs' commands on their granted GPUs (the node's "
                                                     "executor); false: grants only hold GPUs")
    state_dir: str = Field(default="/var/lib/gpupool/agent",
                           description="The executor's state (to re-adopt work after a restart), work dirs, "
                                       "checkpoints and logs; one sub-directory per node")
    checkpoint_root: str = Field(default="", description="Where each job's GPUPOOL_CHECKPOINT_DIR lives: empty = "
                                                         "this node's STATE_DIR/checkpoints; a filesystem every "
                                                         "node mounts lets a requeued job resume on any node")
    drivers: str = Field(default="process,sandbox,container",
                         description="Isolation drivers this node offers (those the machine lacks are left out)")
    device_dir: str = Field(default="/dev", description="Where the NVIDIA device nodes are")
    mps: Literal["auto", "on", "off"] = Field(
        default="auto", description="CUDA MPS for fractions: a control daemon per GPU holding fractions, the work as "
                                    "its client (auto: on for the real backend when the control binary is found)")
    mps_control: str = Field(default="nvidia-cuda-mps-control", min_length=1,
                             description="The MPS control binary (a path, or a name on PATH)")
    mps_dir: str = Field(default="", description="Where each GPU's MPS pipe and log directories go, under a digest "
                                                 "of the node's state dir (default /run/gpupool-mps as root)")
    run_as_uid: int = Field(default=65534, ge=0, le=2**31 - 1, description="Unprivileged user the work runs as")
    max_stop_grace_s: float = Field(default=300.0, ge=0, le=3600, description="Longest grace a stop gives work")
    log_max_mib: int = Field(default=16, ge=1, le=4096, description="Per attempt and stream: the log file and one "
                                                                   "rotated file, each at most this")
    stop_work_on_exit: bool = Field(default=False, description="Kill the node's work when the agent stops (`gpupool "
                                                               "up`'s simulated fleet); false: work survives a "
                                                               "restart and is re-adopted")
    log_retention_s: float = Field(default=86_400.0, ge=0, description="How long an ended attempt's logs and work "
                                                                       "dir are kept (checkpoints stay)")
    resync_s: float = Field(default=30.0, gt=0, description="How often the agent compares its work with "
                                                            "placement's live allocations (a missed grant)")
    nccl_socket_ifname: str = Field(default="", max_length=256, pattern=r"^[A-Za-z0-9_.,:=^-]*$",
                                    description="NCCL_SOCKET_IFNAME for the jobs that rendezvous here (the "
                                                "interfaces NCCL's sockets use, e.g. 'eth0' or '^lo,docker')")
    nccl_ib_hca: str = Field(default="", max_length=256, pattern=r"^[A-Za-z0-9_.,:=^-]*$",
                             description="NCCL_IB_HCA for those jobs (the InfiniBand adapters, e.g. 'mlx5_0,mlx5_1')")
    http_host: str = "127.0.0.1"
    http_port: int = 0
    http_fd: int | None = Field(default=None, ge=0, description="a listening socket inherited from the supervisor (`gpupool up`) to serve on instead of binding http_host:http_port: no other process can take the port between its choice and the bind")
    log_level: str = "INFO"
