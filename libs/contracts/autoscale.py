"""How a replicated job (an inference service) scales itself between `min_replicas` and `max_replicas`: on a load
signal the service reports (requests in flight, queue length: `POST /v1/jobs/{id}/load`), toward `target` load per
replica, with stabilisation windows and a cool-down as Kubernetes' HPA and KEDA have them. The rule is
services/queue/domain.autoscale; every step it takes is a `job.autoscaled` event with its reason."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class AutoscalePolicy(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    signal: Literal["load"] = Field(default="load", description="`load`: the value the service reports (the sum of "
                                    "the latest report of each reporter: the service, or each replica)")
    target: float = Field(gt=0, le=1e9, description="load one replica should carry: replicas = ceil(load / target)")
    scale_up_stabilization_s: float = Field(default=0.0, ge=0, le=3600,
                                            description="scale up to the lowest recommendation of this window")
    scale_down_stabilization_s: float = Field(default=300.0, ge=0, le=86_400,
                                              description="scale down to the highest recommendation of this window")
    cooldown_s: float = Field(default=15.0, ge=0, le=3600, description="at least this between two steps")
    sample_ttl_s: float = Field(default=60.0, gt=0, le=86_400,
                                description="a report older than this is not counted; with none fresh, no step")


class ReplicaBounds(BaseModel):
    """min_replicas ≤ replicas ≤ max_replicas, as a job declares them."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    replicas: int
    min_replicas: int | None = None
    max_replicas: int | None = None
    autoscale: AutoscalePolicy | None = None

    @model_validator(mode="after")
    def _ordered(self) -> ReplicaBounds:
        low = self.min_replicas if self.min_replicas is not None else self.replicas
        high = self.max_replicas if self.max_replicas is not None else self.replicas
        if not low <= self.replicas <= high:
            raise ValueError("want min_replicas <= replicas <= max_replicas")
        if self.autoscale is not None:
            if self.min_replicas is None or self.max_replicas is None:
                raise ValueError("autoscale needs min_replicas and max_replicas")
            if self.min_replicas < 2:
                raise ValueError("autoscale needs min_replicas >= 2 (a job of one replica runs as a single job)")
        return self
