"""Accounting service settings (env prefix GPUPOOL_ACCOUNTING_)."""

from pydantic_settings import SettingsConfigDict

from libs.runtime.settings import ServiceSettings


class AccountingSettings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="GPUPOOL_ACCOUNTING_", extra="ignore")
