"""Base settings every service extends with its own env prefix (`GPUPOOL_<SERVICE>_`)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from libs.contracts.subjects import STREAMS
from libs.store.retention import DEFAULT_INTERVAL_S, DEFAULT_OUTBOX_RETENTION_S

# JetStream may redeliver a message as long as its stream keeps it: the inbox that deduplicates redeliveries must
# remember an event at least that long, or a late redelivery would apply twice.
INBOX_RETENTION_FLOOR_S = max(s.max_age_s for s in STREAMS)


class ServiceSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="GPUPOOL_", extra="ignore")

    environment: Literal["dev", "test", "prod"] = "dev"
    nats_url: str = "nats://127.0.0.1:4222"
    nats_user: str | None = None
    nats_password: str | None = None
    nats_nkey_file: str | None = Field(default=None, description="this identity's nkey seed file (.nk): NATS nkey "
                                       "authentication instead of user and password")
    nats_inbox_prefix: str | None = Field(default=None, pattern=r"^_INBOX[A-Za-z0-9_-]*$",
                                          description="where replies to this identity arrive; the server lets it "
                                                      "subscribe only there (`_INBOX_<identity>`)")
    declare_streams: bool = Field(default=True, description="create or update the JetStream streams at start; "
                                  "false where a provisioning identity does (the service only waits for them)")
    database_url: str = Field(default="postgresql://postgres@127.0.0.1:5432/postgres",
                              description="DSN of this service's own database (created if missing)")
    http_host: str = "127.0.0.1"
    http_port: int = Field(default=0, description="/metrics, /healthz, /readyz; 0 picks a free port")
    http_fd: int | None = Field(default=None, ge=0, description="a listening socket inherited from the supervisor (`gpupool up`) to serve on instead of binding http_host:http_port: no other process can take the port between its choice and the bind")
    log_level: str = "INFO"
    instance: str = Field(default="", description="Replica name (defaults to host:pid)")
    stream_replicas: int | None = Field(default=None, ge=1, le=5,
                                        description="Replicas of each JetStream stream (needs a NATS cluster of at "
                                                    "least that many servers); unset keeps what the stream has")
    metrics_interval_s: float = Field(default=10.0, gt=0, description="How often consumer lag is read for /metrics")
    outbox_retention_s: float = Field(default=DEFAULT_OUTBOX_RETENTION_S, gt=0,
                                      description="Published outbox rows older than this are deleted (unpublished "
                                                  "rows never are)")
    inbox_retention_s: float = Field(default=INBOX_RETENTION_FLOOR_S, gt=0,
                                     description="Inbox rows older than this are deleted; at least the longest "
                                                 "stream max age (30 days), or a late redelivery would apply twice")
    retention_interval_s: float = Field(default=DEFAULT_INTERVAL_S, gt=0,
                                        description="How often old outbox and inbox rows are pruned")

    @model_validator(mode="after")
    def _inbox_outlives_redelivery(self) -> ServiceSettings:
        if self.inbox_retention_s < INBOX_RETENTION_FLOOR_S:
            raise ValueError(
                f"INBOX_RETENTION_S={self.inbox_retention_s:.0f} s is shorter than the {INBOX_RETENTION_FLOOR_S:.0f} s a "
                "stream keeps (and may redeliver) an event: a redelivery after its inbox row was pruned would apply "
                "twice. Set it to at least that.")
        return self
