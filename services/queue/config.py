"""Queue service settings (env prefix GPUPOOL_QUEUE_)."""

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from libs.runtime.settings import ServiceSettings


class QueueSettings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="GPUPOOL_QUEUE_", extra="ignore")

    admission_timeout_s: float = 2.0
    requeue_backoff_s: float = Field(default=5.0, ge=0, description="Back-off before a job lost abnormally (node "
                                                                   "lost, GPU quarantined, drained) is wanted again; "
                                                                   "doubles with each loss")
    requeue_backoff_max_s: float = Field(default=300.0, ge=0, description="Longest requeue back-off")
    requeue_sweep_interval_s: float = Field(default=1.0, gt=0, description="How often due requeues are released")
    autoscale_interval_s: float = Field(default=1.0, gt=0, le=3600,
                                        description="How often each autoscaled service's load is evaluated")
    max_backlog: int = Field(default=10_000, ge=0, description="Jobs that may wait for placement (state pending, "
                                                                "all teams) before a submission is refused with 429 "
                                                                "and Retry-After; 0: no limit")
    backlog_refresh_s: float = Field(default=0.5, gt=0, le=60, description="How often the backlog is recounted "
                                                                            "(between counts each admitted job "
                                                                            "adds one)")
    grant_rate_window_s: float = Field(default=60.0, gt=0, le=3600,
                                       description="Window of the recent grant rate Retry-After is derived from")
    retry_after_max_s: int = Field(default=300, ge=1, le=86400, description="Longest Retry-After of a 429")
