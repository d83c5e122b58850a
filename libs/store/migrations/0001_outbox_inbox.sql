-- Shared by every service database: the transactional outbox and the idempotent-consumer inbox.

CREATE TABLE IF NOT EXISTS outbox (
    seq           BIGSERIAL PRIMARY KEY,
    event_id      TEXT        NOT NULL UNIQUE,          -- CloudEvent id, reused as Nats-Msg-Id on every retry
    subject       TEXT        NOT NULL,
    payload       BYTEA       NOT NULL,                 -- the complete CloudEvent JSON, frozen at commit
    created_at    TIMESTAMPTZ NOT NULL DEFAULT now(),
    published_at  TIMESTAMPTZ,
    attempts      INTEGER     NOT NULL DEFAULT 0,
    last_error    TEXT,
    traceparent   TEXT                                  -- W3C trace context of the transaction that wrote it
);
CREATE INDEX IF NOT EXISTS outbox_unpublished ON outbox (seq) WHERE published_at IS NULL;

CREATE TABLE IF NOT EXISTS inbox (
    consumer     TEXT        NOT NULL,
    event_id     TEXT        NOT NULL,
    processed_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, event_id)
);
