-- What to take back, per job kind: idle allocations (after a warning and a grace period) and work past its
-- declared max runtime. Production inference is never idle-reclaimed by default.
CREATE TABLE reclaim_policies (
    kind                TEXT PRIMARY KEY CHECK (kind IN ('training', 'inference', 'dev', 'batch')),
    idle_after_s        DOUBLE PRECISION,
    idle_util_pct       DOUBLE PRECISION NOT NULL DEFAULT 5,
    grace_s             DOUBLE PRECISION NOT NULL DEFAULT 300,
    enforce_max_runtime BOOLEAN NOT NULL DEFAULT true,
    updated_at          TIMESTAMPTZ NOT NULL DEFAULT now()
);
INSERT INTO reclaim_policies (kind, idle_after_s, grace_s) VALUES
    ('dev', 1800, 300), ('batch', NULL, 300), ('training', NULL, 300), ('inference', NULL, 300);

ALTER TABLE trackers ADD COLUMN kind TEXT NOT NULL DEFAULT 'batch';
ALTER TABLE trackers ADD COLUMN priority_class TEXT NOT NULL DEFAULT '';
ALTER TABLE trackers ADD COLUMN max_runtime_s DOUBLE PRECISION;
ALTER TABLE trackers ADD COLUMN warned_at TIMESTAMPTZ;
ALTER TABLE trackers ADD COLUMN reclaim_deadline TIMESTAMPTZ;
ALTER TABLE trackers ADD COLUMN reclaim_reason TEXT;          -- set: decided, waiting for placement to release
ALTER TABLE trackers ADD COLUMN max_util_pct REAL;
