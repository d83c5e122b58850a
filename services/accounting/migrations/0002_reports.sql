-- Exact, per-GPU ledger: one row per (allocation, GPU slot it holds). Held time is exact to the microsecond
-- (timestamps as the allocation events carry them) and each GPU counts by its share (1000 = whole GPU).
CREATE TABLE gpu_intervals (
    allocation_id  TEXT        NOT NULL,
    slot           INTEGER     NOT NULL,           -- position in the allocation's gpus list
    gpu_uuid       TEXT        NOT NULL,
    gpu_index      INTEGER     NOT NULL,
    job_id         TEXT        NOT NULL,
    team           TEXT        NOT NULL,
    project        TEXT        NOT NULL,
    user_name      TEXT        NOT NULL,
    kind           TEXT        NOT NULL,
    cluster        TEXT        NOT NULL,
    node           TEXT        NOT NULL,
    gpu_model      TEXT        NOT NULL,
    share_milli    INTEGER     NOT NULL CHECK (share_milli BETWEEN 1 AND 1000),
    mig_profile    TEXT        NOT NULL DEFAULT '',
    sharing        TEXT        NOT NULL CHECK (sharing IN ('whole', 'fraction', 'mig')),
    granted_at     TIMESTAMPTZ NOT NULL,
    released_at    TIMESTAMPTZ,
    release_reason TEXT,
    -- Utilization from inventory's one-minute rollups, accumulated over the held time they cover:
    -- covered_us = held µs with a rollup, util_us = Σ covered µs × utilization %, idle_us = covered µs at or below
    -- the idle threshold.
    covered_us     DOUBLE PRECISION NOT NULL DEFAULT 0,
    util_us        DOUBLE PRECISION NOT NULL DEFAULT 0,
    idle_us        DOUBLE PRECISION NOT NULL DEFAULT 0,
    PRIMARY KEY (allocation_id, slot),
    CHECK (released_at IS NULL OR released_at >= granted_at)
);
CREATE INDEX gpu_intervals_granted ON gpu_intervals (granted_at);
CREATE INDEX gpu_intervals_released ON gpu_intervals (released_at);
CREATE INDEX gpu_intervals_gpu ON gpu_intervals (gpu_uuid, granted_at);
CREATE INDEX gpu_intervals_team ON gpu_intervals (team, granted_at);

-- Bring what the first ledger knew into the new one (GPU detail unknown then: whole GPUs, placeholder uuids).
INSERT INTO gpu_intervals (allocation_id, slot, gpu_uuid, gpu_index, job_id, team, project, user_name, kind, cluster,
                           node, gpu_model, share_milli, sharing, granted_at, released_at, release_reason)
SELECT u.allocation_id, s.i, 'legacy:' || u.allocation_id || ':' || s.i, s.i, u.job_id, u.team, u.project, 'unknown',
       'unknown', 'unknown', 'unknown', u.gpu_model, 1000, 'whole', u.started_at, GREATEST(u.ended_at, u.started_at),
       u.release_reason
FROM usage_ledger u CROSS JOIN LATERAL generate_series(0, u.gpu_count - 1) AS s(i);
INSERT INTO gpu_intervals (allocation_id, slot, gpu_uuid, gpu_index, job_id, team, project, user_name, kind, cluster,
                           node, gpu_model, share_milli, sharing, granted_at)
SELECT o.allocation_id, s.i, 'legacy:' || o.allocation_id || ':' || s.i, s.i, o.job_id, o.team, o.project, 'unknown',
       'unknown', 'unknown', 'unknown', o.gpu_model, 1000, 'whole', o.granted_at
FROM open_allocations o CROSS JOIN LATERAL generate_series(0, o.gpu_count - 1) AS s(i)
ON CONFLICT DO NOTHING;
DROP TABLE open_allocations;  -- gpu_intervals with released_at NULL are the open allocations now

-- The per-allocation ledger row gains the new dimensions and its exact size.
ALTER TABLE usage_ledger
    ADD COLUMN user_name    TEXT    NOT NULL DEFAULT 'unknown',
    ADD COLUMN kind         TEXT    NOT NULL DEFAULT 'unknown',
    ADD COLUMN share_milli  INTEGER NOT NULL DEFAULT 0,       -- Σ share_milli over its GPUs
    ADD COLUMN gpu_milli_us BIGINT  NOT NULL DEFAULT 0;       -- held µs × Σ share_milli
UPDATE usage_ledger SET share_milli = gpu_count * 1000,
                        gpu_milli_us = (EXTRACT(EPOCH FROM GREATEST(ended_at, started_at) - started_at) * 1000000)::bigint
                                       * gpu_count * 1000;

-- Inventory's one-minute rollups per GPU (kept ROLLUP_RETENTION_DAYS): the source of interval utilization.
CREATE TABLE gpu_rollups (
    gpu_uuid     TEXT             NOT NULL,
    window_start TIMESTAMPTZ      NOT NULL,
    window_end   TIMESTAMPTZ      NOT NULL,
    cluster      TEXT             NOT NULL,
    node         TEXT             NOT NULL,
    samples      INTEGER          NOT NULL,
    util_avg_pct DOUBLE PRECISION NOT NULL,
    mem_avg_mib  DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (gpu_uuid, window_start),
    CHECK (window_end > window_start)
);
CREATE INDEX gpu_rollups_end ON gpu_rollups (window_end);

-- Who submitted each job (the user dimension) and each spell a job spent waiting in the queue.
CREATE TABLE jobs (
    job_id       TEXT PRIMARY KEY,
    team         TEXT        NOT NULL,
    project      TEXT        NOT NULL,
    user_name    TEXT        NOT NULL,
    kind         TEXT        NOT NULL,
    submitted_at TIMESTAMPTZ NOT NULL
);
CREATE TABLE queue_waits (
    job_id       TEXT        NOT NULL,
    entered_at   TIMESTAMPTZ NOT NULL,   -- when the job (re)entered the queue
    ended_at     TIMESTAMPTZ,            -- first grant or cancellation
    outcome      TEXT CHECK (outcome IN ('granted', 'cancelled')),
    team         TEXT        NOT NULL,
    demand_milli BIGINT      NOT NULL,   -- GPUs asked for, by share (1000 = one whole GPU)
    gpu_model    TEXT        NOT NULL,   -- the granted model; while waiting the one requested, or 'any'
    PRIMARY KEY (job_id, entered_at)
);
CREATE INDEX queue_waits_open ON queue_waits (job_id) WHERE ended_at IS NULL;
CREATE INDEX queue_waits_entered ON queue_waits (entered_at);

-- Supply: the GPUs inventory announced, on nodes not lost, and how the count per model changed over time.
CREATE TABLE supply_nodes (
    cluster TEXT    NOT NULL,
    node    TEXT    NOT NULL,
    lost    BOOLEAN NOT NULL DEFAULT FALSE,
    PRIMARY KEY (cluster, node)
);
CREATE TABLE supply_gpus (
    gpu_uuid  TEXT PRIMARY KEY,
    cluster   TEXT NOT NULL,
    node      TEXT NOT NULL,
    gpu_model TEXT NOT NULL,
    health    TEXT NOT NULL
);
CREATE INDEX supply_gpus_node ON supply_gpus (cluster, node);
CREATE TABLE supply_changes (
    id        BIGSERIAL PRIMARY KEY,
    at        TIMESTAMPTZ NOT NULL,
    gpu_model TEXT        NOT NULL,
    gpus      INTEGER     NOT NULL
);
CREATE INDEX supply_changes_model ON supply_changes (gpu_model, at);

-- Prices with effective dates: per GPU-hour of a model (mig_profile ''), or per instance-hour of a MIG profile.
CREATE TABLE cost_rates (
    gpu_model      TEXT          NOT NULL,
    mig_profile    TEXT          NOT NULL DEFAULT '',
    effective_from TIMESTAMPTZ   NOT NULL,
    price_per_hour NUMERIC(18,6) NOT NULL CHECK (price_per_hour >= 0),
    set_by         TEXT          NOT NULL,
    set_at         TIMESTAMPTZ   NOT NULL,
    PRIMARY KEY (gpu_model, mig_profile, effective_from)
);

-- Orphans inventory reported: processes on GPUs no allocation holds, allocations whose GPUs run nothing.
CREATE TABLE orphans (
    gpu_uuid          TEXT        NOT NULL,
    orphan            TEXT        NOT NULL,
    allocation_id     TEXT        NOT NULL DEFAULT '',
    job_id            TEXT,
    team              TEXT,
    cluster           TEXT        NOT NULL,
    node              TEXT        NOT NULL,
    pids              INTEGER[]   NOT NULL DEFAULT '{}',
    since             TIMESTAMPTZ NOT NULL,
    first_detected_at TIMESTAMPTZ NOT NULL,
    last_detected_at  TIMESTAMPTZ NOT NULL,
    reports           INTEGER     NOT NULL DEFAULT 1,
    PRIMARY KEY (gpu_uuid, orphan, allocation_id)
);

-- Exact microseconds from a to b (EXTRACT(EPOCH ...) is numeric, so nothing is rounded), never negative.
CREATE FUNCTION acct_us(a TIMESTAMPTZ, b TIMESTAMPTZ) RETURNS BIGINT
    LANGUAGE SQL IMMUTABLE PARALLEL SAFE
    RETURN GREATEST(0, (EXTRACT(EPOCH FROM b) - EXTRACT(EPOCH FROM a)) * 1000000)::bigint;
