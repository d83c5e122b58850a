"""Inventory service settings (env prefix GPUPOOL_INVENTORY_)."""

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from libs.runtime.settings import ServiceSettings


class InventorySettings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="GPUPOOL_INVENTORY_", extra="ignore")

    node_lost_after_s: float = Field(
        default=15.0, gt=0,
        description="A ready node that has not reported for this long is declared lost (the agent sends a sample "
                    "every interval: its heartbeat); also how fresh a sample must be to count a GPU as in use")
    node_sweep_interval_s: float = Field(default=1.0, gt=0, description="Seconds between node-lost sweeps")
