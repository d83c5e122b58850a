-- The scheduling policy as learned from the quota service (newest revision wins), and what placement needs to
-- know about running work to preempt it: priority, class, kind, and the preemption in progress if any.
CREATE TABLE policy_teams (
    team      TEXT PRIMARY KEY,
    org       TEXT   NOT NULL,
    revision  BIGINT NOT NULL
);

CREATE TABLE policy_quotas (
    path            TEXT    NOT NULL,
    gpu_model       TEXT    NOT NULL,
    guaranteed      DOUBLE PRECISION NOT NULL,
    borrowing_limit DOUBLE PRECISION,
    lending_limit   DOUBLE PRECISION,
    weight          DOUBLE PRECISION NOT NULL,
    deleted         BOOLEAN NOT NULL DEFAULT false,
    revision        BIGINT  NOT NULL,
    PRIMARY KEY (path, gpu_model)
);

CREATE TABLE policy_priority_classes (
    name           TEXT PRIMARY KEY,
    value          INTEGER NOT NULL,
    preemptible    BOOLEAN NOT NULL,
    min_runtime_s  DOUBLE PRECISION,
    revision       BIGINT  NOT NULL
);

ALTER TABLE pending_jobs ADD COLUMN priority_class TEXT NOT NULL DEFAULT '';
ALTER TABLE pending_jobs ADD COLUMN kind TEXT NOT NULL DEFAULT 'batch';

ALTER TABLE allocations ADD COLUMN priority INTEGER NOT NULL DEFAULT 0;
ALTER TABLE allocations ADD COLUMN priority_class TEXT NOT NULL DEFAULT '';
ALTER TABLE allocations ADD COLUMN kind TEXT NOT NULL DEFAULT 'batch';
ALTER TABLE allocations ADD COLUMN preempt_deadline TIMESTAMPTZ;   -- set: a preemption is in progress
ALTER TABLE allocations ADD COLUMN preempt_reason TEXT;
ALTER TABLE allocations ADD COLUMN preempted_by TEXT;
CREATE INDEX allocations_preempting ON allocations (preempt_deadline) WHERE released_at IS NULL AND preempt_deadline IS NOT NULL;
