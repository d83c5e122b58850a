"""Gateway settings (env prefix GPUPOOL_GATEWAY_). Refuses an unsafe admin token outside dev."""

from __future__ import annotations

from pydantic import Field, model_validator
from pydantic_settings import SettingsConfigDict

from libs.runtime.settings import ServiceSettings


class GatewaySettings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="GPUPOOL_GATEWAY_", extra="ignore")

    port: int = 8080
    admin_token: str = Field(default="", description="Bootstrap bearer token with the platform-admin role")
    request_timeout_s: float = 5.0
    max_body_bytes: int = Field(default=64 * 1024, description="Larger request bodies are refused with 413")
    max_event_streams: int = Field(default=8, ge=1, le=10_000, description="open `GET /v1/events` streams per "
                                   "caller; more are refused with 429")
    token_cache_s: float = Field(default=30.0, ge=0, description="How long a verified token is reused without a "
                                 "database lookup (revocations still apply at once); 0 turns the cache off")
    trace_url_template: str | None = Field(
        default=None, pattern=r"\{trace_id\}",
        description="Where the dashboard's job page links a job's trace: a URL with `{trace_id}`, e.g. "
                    "Grafana Explore on Tempo or Jaeger's /trace/{trace_id} (unset: the trace id without a link)")
    # OIDC / JWT bearer tokens (optional): validated against this issuer, audience and JWKS.
    oidc_issuer: str | None = None
    oidc_audience: str | None = None
    oidc_jwks_url: str | None = None
    oidc_role_claim: str = "gpupool_role"
    oidc_team_claim: str = "gpupool_team"
    oidc_default_role: str = "viewer"

    @model_validator(mode="after")
    def _safe_settings(self) -> GatewaySettings:
        if self.environment != "dev" and len(self.admin_token) < 32:
            raise ValueError("GPUPOOL_GATEWAY_ADMIN_TOKEN must be set to at least 32 random characters outside dev")
        if self.oidc_jwks_url and not (self.oidc_issuer and self.oidc_audience):
            raise ValueError("OIDC needs GPUPOOL_GATEWAY_OIDC_ISSUER and _OIDC_AUDIENCE with _OIDC_JWKS_URL")
        return self
