"""How a replicated job (an inference service) scales itself between `min_replicas` and `max_replicas`, toward
`target` per replica, with stabilisation windows and a cool-down as Kubernetes' HPA and KEDA have them, on one of
three signals: `load` the service pushes (requests in flight, queue length: `POST /v1/jobs/{id}/load`), its
replicas' `gpu_utilization` (each replica's GPUs' mean utilisation, sampled by its node's agent from telemetry), or
a Prometheus `metric` the agent scrapes from each replica. The rule is services/queue/domain.autoscale; every step
it takes is a `job.autoscaled` event with its reason."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from libs.contracts.work import METRIC_NAME, LoadProbe, PortName

Signal = Literal["load", "gpu_utilization", "metric"]


class AutoscalePolicy(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    signal: Signal = Field(default="load", description="`load`: the value the service reports (the sum of the "
                           "latest report of each reporter: the service, or each replica); `gpu_utilization`: the "
                           "sum of each replica's GPUs' mean utilisation, percent; `metric`: the sum over replicas "
                           "of a Prometheus metric scraped from each")
    target: float = Field(gt=0, le=1e9, description="what one replica should carry: replicas = ceil(signal / "
                          "target); gpu_utilization: a percentage, at most 100")
    metric: str | None = Field(default=None, pattern=METRIC_NAME,
                               description="signal metric: the metric's name (every series of it is summed)")
    metric_port: PortName | None = Field(default=None, description="signal metric: the port (a name of the work's "
                                         "`ports`) it is served on; default the first")
    metric_path: str = Field(default="/metrics", max_length=256, pattern=r"^/[A-Za-z0-9._~/%-]*$",
                             description="signal metric: the path it is served at")
    sample_every_s: float = Field(default=10.0, ge=0.5, le=600, description="gpu_utilization, metric: how often "
                                  "the agent samples each replica")
    scale_up_stabilization_s: float = Field(default=0.0, ge=0, le=3600,
                                            description="scale up to the lowest recommendation of this window")
    scale_down_stabilization_s: float = Field(default=300.0, ge=0, le=86_400,
                                              description="scale down to the highest recommendation of this window")
    cooldown_s: float = Field(default=15.0, ge=0, le=3600, description="at least this between two steps")
    sample_ttl_s: float = Field(default=60.0, gt=0, le=86_400,
                                description="a report older than this is not counted; with none fresh, no step")

    @model_validator(mode="after")
    def _signal_complete(self) -> AutoscalePolicy:
        if (self.signal == "metric") != (self.metric is not None):
            raise ValueError("a metric name goes with signal metric, and signal metric needs one")
        if self.metric_port is not None and self.signal != "metric":
            raise ValueError("metric_port goes with signal metric")
        if self.signal == "gpu_utilization" and self.target > 100:
            raise ValueError("a gpu_utilization target is a percentage: at most 100")
        if self.signal != "load" and self.sample_every_s >= self.sample_ttl_s:
            raise ValueError("sample_every_s must be shorter than sample_ttl_s, or no sample is ever fresh")
        return self

    def probe(self, ports: list[str]) -> LoadProbe | None:
        """What each replica's agent samples for this policy (None: the service pushes its load). ValueError when
        the work cannot be sampled so (a metric needs a port to scrape)."""
        if self.signal == "load":
            return None
        if self.signal == "gpu_utilization":
            return LoadProbe(signal="gpu_utilization", every_s=self.sample_every_s)
        port = self.metric_port or (ports[0] if ports else None)
        if port is None or port not in ports:
            raise ValueError("autoscale on a metric needs the work's ports, and metric_port among them")
        return LoadProbe(signal="metric", every_s=self.sample_every_s, metric=self.metric, port=port,
                         path=self.metric_path)


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
            if self.max_replicas < 2:
                raise ValueError("autoscale needs max_replicas >= 2: room to scale")
        return self
