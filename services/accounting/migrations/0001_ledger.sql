-- Allocations seen granted but not yet released (so usage can be computed even if a release is delayed).
CREATE TABLE open_allocations (
    allocation_id TEXT PRIMARY KEY,
    job_id        TEXT        NOT NULL,
    team          TEXT        NOT NULL,
    project       TEXT        NOT NULL,
    gpu_model     TEXT        NOT NULL,
    gpu_count     INTEGER     NOT NULL,
    granted_at    TIMESTAMPTZ NOT NULL
);

-- The GPU-hour ledger: one row per allocation, written once when it is released.
CREATE TABLE usage_ledger (
    allocation_id TEXT PRIMARY KEY,
    job_id        TEXT             NOT NULL,
    team          TEXT             NOT NULL,
    project       TEXT             NOT NULL,
    gpu_model     TEXT             NOT NULL,
    gpu_count     INTEGER          NOT NULL CHECK (gpu_count > 0),
    gpu_seconds   DOUBLE PRECISION NOT NULL CHECK (gpu_seconds >= 0),
    started_at    TIMESTAMPTZ      NOT NULL,
    ended_at      TIMESTAMPTZ      NOT NULL,
    release_reason TEXT            NOT NULL,
    recorded_at   TIMESTAMPTZ      NOT NULL DEFAULT now()
);
CREATE INDEX usage_ledger_team ON usage_ledger (team, ended_at);
