-- Placement's read model of the pool (learned from inventory events) and the allocations it alone writes.

CREATE TABLE nodes (
    cluster       TEXT        NOT NULL,
    node          TEXT        NOT NULL,
    schedulable   BOOLEAN     NOT NULL DEFAULT true,
    updated_at    TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (cluster, node)
);

CREATE TABLE gpus (
    uuid        TEXT PRIMARY KEY,
    cluster     TEXT    NOT NULL,
    node        TEXT    NOT NULL,
    idx         INTEGER NOT NULL,
    model       TEXT    NOT NULL,
    memory_mib  INTEGER NOT NULL,
    health      TEXT    NOT NULL DEFAULT 'healthy',
    FOREIGN KEY (cluster, node) REFERENCES nodes (cluster, node)
);

CREATE TABLE pending_jobs (
    job_id        TEXT PRIMARY KEY,
    team          TEXT        NOT NULL,
    project       TEXT        NOT NULL,
    gpus          INTEGER     NOT NULL,
    gpu_models    TEXT[]      NOT NULL DEFAULT '{}',
    priority      INTEGER     NOT NULL,
    submitted_at  TIMESTAMPTZ NOT NULL,
    reason        TEXT,
    message       TEXT
);

CREATE TABLE allocations (
    allocation_id  TEXT PRIMARY KEY,
    job_id         TEXT        NOT NULL,
    team           TEXT        NOT NULL,
    project        TEXT        NOT NULL,
    cluster        TEXT        NOT NULL,
    node           TEXT        NOT NULL,
    granted_at     TIMESTAMPTZ NOT NULL,
    released_at    TIMESTAMPTZ,
    release_reason TEXT
);
-- A job holds at most one live allocation.
CREATE UNIQUE INDEX allocations_one_live_per_job ON allocations (job_id) WHERE released_at IS NULL;

CREATE TABLE allocation_gpus (
    allocation_id TEXT    NOT NULL REFERENCES allocations (allocation_id),
    gpu_uuid      TEXT    NOT NULL REFERENCES gpus (uuid),
    gpu_index     INTEGER NOT NULL,
    model         TEXT    NOT NULL,
    live          BOOLEAN NOT NULL DEFAULT true,
    PRIMARY KEY (allocation_id, gpu_uuid)
);
-- The constraint that makes double allocation impossible, whatever the scheduler computed.
CREATE UNIQUE INDEX allocation_gpus_one_live_holder ON allocation_gpus (gpu_uuid) WHERE live;

-- Jobs that finished before placement saw them submitted (ordering across redeliveries): never place them.
CREATE TABLE finished_jobs (
    job_id      TEXT PRIMARY KEY,
    finished_at TIMESTAMPTZ NOT NULL DEFAULT now()
);
