-- Admission rules that send a submission to a person first, and the approval requests they create.
CREATE TABLE approval_rules (
    rule        TEXT PRIMARY KEY CHECK (rule IN ('gpus_over', 'runtime_over_s', 'priority_class')),
    value       TEXT        NOT NULL,
    enabled     BOOLEAN     NOT NULL DEFAULT true,
    updated_at  TIMESTAMPTZ NOT NULL DEFAULT now()
);

CREATE TABLE approval_requests (
    approval_id   TEXT PRIMARY KEY,
    job_id        TEXT        NOT NULL UNIQUE,
    job_name      TEXT        NOT NULL,
    team          TEXT        NOT NULL,
    project       TEXT        NOT NULL,
    gpus          INTEGER     NOT NULL,
    priority_class TEXT       NOT NULL,
    reasons       TEXT[]      NOT NULL,
    requested_by  TEXT        NOT NULL,
    state         TEXT        NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'approved', 'denied')),
    comment       TEXT        NOT NULL DEFAULT '',
    decided_by    TEXT,
    created_at    TIMESTAMPTZ NOT NULL DEFAULT now(),
    decided_at    TIMESTAMPTZ
);
CREATE INDEX approval_requests_team_state ON approval_requests (team, state);
