-- What each job asked for, as its JobSubmitted said (the latest submission wins): the shape a history export
-- replays. Jobs recorded before this migration keep NULLs; the export falls back to what their allocations held.
ALTER TABLE jobs
    ADD COLUMN name               TEXT,
    ADD COLUMN priority           INTEGER,
    ADD COLUMN priority_class     TEXT,
    ADD COLUMN gpus               INTEGER,
    ADD COLUMN gpu_models         TEXT[],
    ADD COLUMN gpu_fraction_milli INTEGER,
    ADD COLUMN mig_profile        TEXT,
    ADD COLUMN gang_nodes         INTEGER,
    ADD COLUMN gpus_per_node      INTEGER,
    ADD COLUMN replicas           INTEGER,
    ADD COLUMN max_runtime_s      DOUBLE PRECISION;
CREATE INDEX jobs_submitted ON jobs (submitted_at, job_id);
CREATE INDEX gpu_intervals_job ON gpu_intervals (job_id);
CREATE INDEX queue_waits_job ON queue_waits (job_id, entered_at);
