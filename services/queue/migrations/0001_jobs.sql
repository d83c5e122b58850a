CREATE TABLE jobs (
    job_id          TEXT PRIMARY KEY,
    name            TEXT        NOT NULL,
    team            TEXT        NOT NULL,
    project         TEXT        NOT NULL,
    kind            TEXT        NOT NULL,
    priority_class  TEXT        NOT NULL,
    priority        INTEGER     NOT NULL,
    gpus            INTEGER     NOT NULL CHECK (gpus > 0),
    gpu_models      TEXT[]      NOT NULL DEFAULT '{}',
    state           TEXT        NOT NULL CHECK (state IN ('pending','running','completed','cancelled','failed')),
    submitted_by    TEXT        NOT NULL,
    submitted_at    TIMESTAMPTZ NOT NULL,
    started_at      TIMESTAMPTZ,
    finished_at     TIMESTAMPTZ,
    allocation_id   TEXT,
    cluster         TEXT,
    node            TEXT,
    message         TEXT,
    idempotency_key TEXT UNIQUE,
    request_hash    TEXT
);
CREATE INDEX jobs_team_state ON jobs (team, state, job_id);
CREATE INDEX jobs_state ON jobs (state, job_id);

CREATE TABLE job_history (
    id          BIGSERIAL PRIMARY KEY,
    job_id      TEXT        NOT NULL REFERENCES jobs (job_id),
    at          TIMESTAMPTZ NOT NULL DEFAULT now(),
    from_state  TEXT,
    to_state    TEXT        NOT NULL,
    reason      TEXT        NOT NULL
);
CREATE INDEX job_history_job ON job_history (job_id, id);
