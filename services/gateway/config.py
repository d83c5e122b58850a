"""Gateway settings (env prefix GPUPOOL_GATEWAY_). Refuses an unsafe admin token outside dev."""

from __future__ import annotations

from pydantic import Field, model_validator
from pydantic_settings import SettingsConfigDict

from libs.runtime.settings import ServiceSettings


class GatewaySettings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="GPUPOOL_GATEWAY_", extra="ignore")

    port: int = 8080
    admin_token: str = Field(default="", description="Bearer token with every right (bootstrap/admin)")
    request_timeout_s: float = 5.0

    @model_validator(mode="after")
    def _safe_token(self) -> GatewaySettings:
        if self.environment != "dev" and len(self.admin_token) < 32:
            raise ValueError("GPUPOOL_GATEWAY_ADMIN_TOKEN must be set to at least 32 random characters outside dev")
        return self
