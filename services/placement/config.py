"""Placement service settings (env prefix GPUPOOL_PLACEMENT_)."""

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from libs.runtime.settings import ServiceSettings


class PlacementSettings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="GPUPOOL_PLACEMENT_", extra="ignore")

    cycle_interval_s: float = Field(default=1.0, description="Longest wait between scheduling cycles")
    policy: str = "default"
    lease_ttl_s: float = Field(default=3.0, description="Leader lease TTL: a dead leader is replaced within ~this")
    lease_renew_s: float = Field(default=1.0, description="How often the leader renews (at most TTL / 2)")
