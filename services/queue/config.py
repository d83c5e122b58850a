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
