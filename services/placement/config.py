"""Placement service settings (env prefix GPUPOOL_PLACEMENT_)."""

from pydantic import Field, model_validator
from pydantic_settings import SettingsConfigDict

from libs.runtime.settings import ServiceSettings


class PlacementSettings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="GPUPOOL_PLACEMENT_", extra="ignore")

    cycle_interval_s: float = Field(default=1.0, description="Longest wait between scheduling cycles")
    cycle_gather_s: float = Field(default=0.005, ge=0, le=1,
                                  description="After a wake-up, wait this long for more events before a cycle")
    cycle_gather_max_s: float = Field(default=0.05, ge=0, le=1,
                                      description="Under load a cycle waits as long as the previous one took, "
                                                  "at most this long, so that it handles more jobs at once")
    policy: str = "default"
    consumer_ack_wait_s: float = Field(default=5.0, ge=1, description="Events not acked within this are redelivered "
                                                                        "(to another replica if this one died)")
    consumer_batch: int = Field(default=32, ge=1, le=256,
                                description="Events fetched and applied in one transaction")
    preemption_grace_s: float = Field(default=30.0, ge=0, description="Checkpoint time a preempted job gets")
    policy_reconcile_s: float = Field(default=300.0, ge=5, le=86_400,
                                      description="Between reconciliations with the quota service's policy (a "
                                                  "forged policy row is repaired within this)")
    max_stop_grace_s: float = Field(default=300.0, ge=0, le=3600,
                                    description="Longest stop grace a job's work gets on cancel, completion, "
                                                "reclaim or scale-down (its own stop_grace_s below this)")
    stop_report_timeout_s: float = Field(default=120.0, ge=1,
                                         description="An allocation that runs work is released this long after its "
                                                     "stop deadline even if its agent never reported the exit")
    min_runtime_s: float = Field(default=300.0, ge=0, description="Never preempt work younger than this (unless "
                                                                  "its priority class says otherwise)")
    lease_ttl_s: float = Field(default=3.0, description="Leader lease TTL: a dead leader is replaced within ~this")
    lease_renew_s: float = Field(default=1.0, description="How often the leader renews (at most TTL / 2)")
    fair_share_half_life_s: float = Field(default=7 * 24 * 3600.0, gt=0, le=365 * 24 * 3600,
                                          description="Fair share's memory: a team's past GPU-seconds count half "
                                                      "after this long when its jobs are ordered against others'")
    fragmentation_window_s: float = Field(default=86_400.0, ge=60, le=30 * 86_400,
                                          description="The live fragmentation measure's workload: shapes of grants "
                                                      "made within this (and of every waiting job)")
    fragmentation_recent_grants: int = Field(default=5000, ge=1, le=100_000,
                                             description="At most this many of the newest grants in that window")
    fragmentation_interval_s: float = Field(default=30.0, ge=1, le=3600,
                                            description="Between updates of the fragmentation gauges (the leader's)")
    dev_fraction_milli: int = Field(default=500, ge=1, le=999,
                                    description="Share of a GPU a dev job gets by default on a fractional GPU")
    dev_gpu_memory_mib: int = Field(default=16384, ge=1,
                                    description="GPU memory of that default share (and the smallest MIG slice "
                                                "a dev job gets by default on a MIG GPU)")
    decision_retention: int = Field(default=2000, ge=1,
                                    description="Recorded scheduling cycles kept for `gpupool decisions replay`")
    gang_start_timeout_s: float = Field(default=300.0, ge=1, le=86_400,
                                        description="A gang whose members are not all ready (grant applied on "
                                                    "their nodes) within this of the grant is released and "
                                                    "requeued (GangStartTimeout)")
    rendezvous_ports: str = Field(default="29500-29999", pattern=r"^[0-9]{1,5}-[0-9]{1,5}$",
                                  description="Ports (first-last) a job's rendezvous is given from, on its rank-0 "
                                              "member's node: reserve them for gpupool on the nodes")

    def rendezvous_range(self) -> tuple[int, int]:
        first, _, last = self.rendezvous_ports.partition("-")
        return int(first), int(last)

    @model_validator(mode="after")
    def _check_ports(self) -> "PlacementSettings":
        first, last = self.rendezvous_range()
        if not 1024 <= first <= last <= 65535:
            raise ValueError(f"rendezvous_ports {self.rendezvous_ports!r}: want first-last within 1024-65535")
        return self
