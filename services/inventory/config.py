"""Inventory service settings (env prefix GPUPOOL_INVENTORY_)."""

from pydantic_settings import SettingsConfigDict

from libs.runtime.settings import ServiceSettings


class InventorySettings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="GPUPOOL_INVENTORY_", extra="ignore")
