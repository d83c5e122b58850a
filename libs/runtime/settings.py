"""Base settings every service extends with its own env prefix (`GPUPOOL_<SERVICE>_`)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class ServiceSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="GPUPOOL_", extra="ignore")

    environment: Literal["dev", "test", "prod"] = "dev"
    nats_url: str = "nats://127.0.0.1:4222"
    nats_user: str | None = None
    nats_password: str | None = None
    database_url: str = Field(default="postgresql://postgres@127.0.0.1:5432/postgres",
                              description="DSN of this service's own database (created if missing)")
    http_host: str = "127.0.0.1"
    http_port: int = Field(default=0, description="/metrics, /healthz, /readyz; 0 picks a free port")
    log_level: str = "INFO"
    instance: str = Field(default="", description="Replica name (defaults to host:pid)")
    stream_replicas: int | None = Field(default=None, ge=1, le=5,
                                        description="Replicas of each JetStream stream (needs a NATS cluster of at "
                                                    "least that many servers); unset keeps what the stream has")
    metrics_interval_s: float = Field(default=10.0, gt=0, description="How often consumer lag is read for /metrics")
