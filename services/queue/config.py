"""Queue service settings (env prefix GPUPOOL_QUEUE_)."""

from pydantic_settings import SettingsConfigDict

from libs.runtime.settings import ServiceSettings


class QueueSettings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="GPUPOOL_QUEUE_", extra="ignore")

    admission_timeout_s: float = 2.0
