-- Fair share's memory: each team's GPU-seconds per model, decayed with the policy's half-life up to `as_of`. Every
-- release adds the allocation's GPU-seconds (a share of a GPU counts its share) in the same statement; the core
-- decays the records further to the cycle's time. `fair_share_config` holds the half-life that release applies
-- (written by placement at start from its policy).
CREATE TABLE team_usage (
    team        TEXT NOT NULL,
    gpu_model   TEXT NOT NULL,
    gpu_seconds DOUBLE PRECISION NOT NULL CHECK (gpu_seconds >= 0),
    as_of       TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (team, gpu_model)
);
CREATE TABLE fair_share_config (
    id          BOOLEAN PRIMARY KEY DEFAULT true CHECK (id),
    half_life_s DOUBLE PRECISION NOT NULL CHECK (half_life_s > 0)
);
-- The order the last scheduling cycle tried the waiting jobs in (priority, fair share, submit time): what
-- `explain` reports as a job's position. One row, rewritten only when the order changed.
CREATE TABLE queue_order (
    id         BOOLEAN PRIMARY KEY DEFAULT true CHECK (id),
    job_ids    TEXT[] NOT NULL,
    decided_at TIMESTAMPTZ NOT NULL
);
