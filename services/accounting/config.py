"""Accounting service settings (env prefix GPUPOOL_ACCOUNTING_)."""

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from libs.runtime.settings import ServiceSettings


class AccountingSettings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="GPUPOOL_ACCOUNTING_", extra="ignore")

    idle_util_pct: float = Field(default=5.0, ge=0, le=100,
                                 description="A rollup minute at or below this GPU utilization counts as idle")
    currency: str = Field(default="USD", min_length=1, max_length=8, description="The currency of every cost rate")
    rollup_retention_days: float = Field(default=8.0, gt=0,
                                         description="Rollups older than this are deleted (an interval's utilization "
                                                     "is accumulated as rollups arrive, so nothing is lost)")
    prune_interval_s: float = Field(default=3600.0, gt=0, description="How often old rollups are pruned")
