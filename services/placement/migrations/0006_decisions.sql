-- Scheduling cycles that decided something, with their whole input, so a cycle can be scheduled again and
-- compared (`gpupool decisions replay`). Only the newest `decision_retention` are kept.
CREATE TABLE decisions (
    cycle_id      TEXT PRIMARY KEY,          -- uuid7: time-ordered
    decided_at    TIMESTAMPTZ NOT NULL,
    policy        TEXT        NOT NULL,
    input_digest  TEXT        NOT NULL,
    plan_digest   TEXT        NOT NULL,
    input_gz      BYTEA       NOT NULL,      -- gzip of libs.core.codec's JSON of {snapshot, pending, policy, now}
    plan_json     TEXT        NOT NULL,      -- libs.core.codec's JSON of the plan
    summary       JSONB       NOT NULL       -- the SchedulingCycleDecided payload
);
