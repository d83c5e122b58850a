"""Quota service settings (env prefix GPUPOOL_QUOTA_)."""

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from libs.runtime.settings import ServiceSettings


class QuotaSettings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="GPUPOOL_QUOTA_", extra="ignore")

    seed_teams: str = Field(default="", description="Comma-separated teams to create at start (dev stacks)")
    loan_sweep_interval_s: float = Field(default=5.0, gt=0, description="How often ended quota loans are announced")
