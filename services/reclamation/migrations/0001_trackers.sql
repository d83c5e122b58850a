-- One tracker per live allocation: when its GPUs were last seen busy, from real telemetry.
CREATE TABLE trackers (
    allocation_id  TEXT PRIMARY KEY,
    job_id         TEXT        NOT NULL,
    team           TEXT        NOT NULL,
    cluster        TEXT        NOT NULL,
    node           TEXT        NOT NULL,
    gpu_uuids      TEXT[]      NOT NULL,
    granted_at     TIMESTAMPTZ NOT NULL,
    last_busy_at   TIMESTAMPTZ NOT NULL,
    last_sample_at TIMESTAMPTZ,
    mean_util_pct  REAL
);
CREATE INDEX trackers_node ON trackers (cluster, node);
