-- The GPU health state machine (healthy → suspect → quarantined → probation → healthy). `health` stays the coarse
-- view every consumer already reads (healthy / degraded / failed), kept in step with `state`.
ALTER TABLE gpus ADD COLUMN state TEXT NOT NULL DEFAULT 'healthy'
    CHECK (state IN ('healthy', 'suspect', 'quarantined', 'probation'));
ALTER TABLE gpus ADD COLUMN state_since TIMESTAMPTZ;
ALTER TABLE gpus ADD COLUMN state_reason TEXT NOT NULL DEFAULT '';
ALTER TABLE gpus ADD COLUMN state_details TEXT[] NOT NULL DEFAULT '{}';
ALTER TABLE gpus ADD COLUMN last_signal_at TIMESTAMPTZ;
ALTER TABLE gpus ADD COLUMN strikes INTEGER NOT NULL DEFAULT 0;
ALTER TABLE gpus ADD COLUMN last_strike_at TIMESTAMPTZ;
-- How the GPU is shared (placement places whole GPUs, fractions or MIG slices accordingly).
ALTER TABLE gpus ADD COLUMN sharing TEXT NOT NULL DEFAULT 'exclusive'
    CHECK (sharing IN ('exclusive', 'fractional', 'mig'));
ALTER TABLE gpus ADD COLUMN sharing_set_by TEXT;
ALTER TABLE gpus ADD COLUMN sharing_set_at TIMESTAMPTZ;
-- Processes seen on the GPU, kept with its latest sample: since when continuously (orphans on GPUs nobody holds)
-- and the last time any (allocations that show no process).
ALTER TABLE gpu_telemetry_latest ADD COLUMN procs_since TIMESTAMPTZ;
ALTER TABLE gpu_telemetry_latest ADD COLUMN last_process_at TIMESTAMPTZ;

-- Cordon / drain: an operator's "no new work here" (and, for a drain, "take its work back").
ALTER TABLE nodes ADD COLUMN cordoned BOOLEAN NOT NULL DEFAULT false;
ALTER TABLE nodes ADD COLUMN cordoned_at TIMESTAMPTZ;
ALTER TABLE nodes ADD COLUMN cordoned_by TEXT;
ALTER TABLE nodes ADD COLUMN cordon_reason TEXT;
ALTER TABLE nodes ADD COLUMN drained BOOLEAN NOT NULL DEFAULT false;

-- One-minute rollups per GPU: sums while the minute is open; `emitted` once TelemetryRolledUp went out (late
-- samples for an emitted minute are ignored, so the event and the table agree).
CREATE TABLE gpu_rollups (
    uuid          TEXT        NOT NULL,
    window_start  TIMESTAMPTZ NOT NULL,
    cluster       TEXT        NOT NULL,
    node          TEXT        NOT NULL,
    idx           INTEGER     NOT NULL,
    samples       INTEGER     NOT NULL,
    util_sum      DOUBLE PRECISION NOT NULL,
    util_max      REAL        NOT NULL,
    mem_sum       DOUBLE PRECISION NOT NULL,
    mem_max       INTEGER     NOT NULL,
    power_sum     DOUBLE PRECISION NOT NULL,
    power_n       INTEGER     NOT NULL,
    temp_max      REAL,
    procs_max     INTEGER     NOT NULL,
    emitted       BOOLEAN     NOT NULL DEFAULT false,
    PRIMARY KEY (uuid, window_start)
);
CREATE INDEX gpu_rollups_open ON gpu_rollups (window_start) WHERE NOT emitted;
CREATE INDEX gpu_rollups_node ON gpu_rollups (cluster, node, window_start);

-- Live allocations as learned from placement's events: which GPUs are held (orphans) and by whom.
CREATE TABLE held_allocations (
    allocation_id TEXT PRIMARY KEY,
    job_id        TEXT        NOT NULL,
    team          TEXT        NOT NULL,
    cluster       TEXT        NOT NULL,
    node          TEXT        NOT NULL,
    gpu_uuids     TEXT[]      NOT NULL,
    granted_at    TIMESTAMPTZ NOT NULL
);
-- One row per GPU an allocation holds (several fractions or MIG slices may share a GPU).
CREATE TABLE held_gpus (
    gpu_uuid      TEXT NOT NULL,
    allocation_id TEXT NOT NULL REFERENCES held_allocations (allocation_id) ON DELETE CASCADE,
    PRIMARY KEY (gpu_uuid, allocation_id)
);
CREATE INDEX held_gpus_allocation ON held_gpus (allocation_id);
-- Allocations released before their grant arrived (events of one stream can still be redelivered out of order).
CREATE TABLE released_allocations (
    allocation_id TEXT PRIMARY KEY,
    released_at   TIMESTAMPTZ NOT NULL
);

-- Orphans reported (one open row per GPU and kind, or per allocation), closed when the condition ends.
CREATE TABLE orphans (
    id            BIGSERIAL PRIMARY KEY,
    kind          TEXT        NOT NULL CHECK (kind IN ('process_without_allocation', 'allocation_without_process')),
    cluster       TEXT        NOT NULL,
    node          TEXT        NOT NULL,
    gpu_uuid      TEXT        NOT NULL,
    allocation_id TEXT,
    job_id        TEXT,
    team          TEXT,
    since         TIMESTAMPTZ NOT NULL,
    detected_at   TIMESTAMPTZ NOT NULL,
    resolved_at   TIMESTAMPTZ
);
CREATE UNIQUE INDEX orphans_open_gpu ON orphans (gpu_uuid) WHERE resolved_at IS NULL
    AND kind = 'process_without_allocation';
CREATE UNIQUE INDEX orphans_open_allocation ON orphans (allocation_id) WHERE resolved_at IS NULL
    AND kind = 'allocation_without_process';
