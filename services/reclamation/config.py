"""Reclamation service settings (env prefix GPUPOOL_RECLAMATION_)."""

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from libs.runtime.settings import ServiceSettings


class ReclamationSettings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="GPUPOOL_RECLAMATION_", extra="ignore")

    busy_util_pct: float = Field(default=5.0, description="A GPU above this utilization counts as busy (kinds "
                                                          "without a policy)")
    sweep_interval_s: float = Field(default=2.0, gt=0, description="How often trackers are judged")
    max_abnormal_restarts: int = Field(default=3, ge=0,
                                       description="A job that lost its GPUs abnormally (node lost, GPU quarantined, "
                                                   "drain) more often than this is failed (RestartLimitReached) "
                                                   "instead of requeued")
