-- API tokens for people and service accounts: only a hash of the secret is stored; it is shown once at creation.
CREATE TABLE api_tokens (
    token_id     TEXT PRIMARY KEY,
    name         TEXT        NOT NULL,
    role         TEXT        NOT NULL CHECK (role IN ('platform-admin','operator','team-admin','member','viewer','service')),
    team         TEXT,
    secret_hash  TEXT        NOT NULL,
    created_by   TEXT        NOT NULL,
    created_at   TIMESTAMPTZ NOT NULL DEFAULT now(),
    expires_at   TIMESTAMPTZ,
    revoked_at   TIMESTAMPTZ,
    last_used_at TIMESTAMPTZ,
    CHECK (role IN ('platform-admin','operator') OR team IS NOT NULL OR role = 'service')
);
CREATE INDEX api_tokens_team ON api_tokens (team);

-- Every administrative action: who, what, when, before/after.
CREATE TABLE audit_log (
    id          BIGSERIAL PRIMARY KEY,
    at          TIMESTAMPTZ NOT NULL DEFAULT now(),
    actor       TEXT        NOT NULL,
    actor_role  TEXT        NOT NULL,
    action      TEXT        NOT NULL,
    target      TEXT,
    before      JSONB,
    after       JSONB,
    trace_id    TEXT
);
CREATE INDEX audit_log_at ON audit_log (at);
