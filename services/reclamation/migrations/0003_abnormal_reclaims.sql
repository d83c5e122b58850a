-- How often each job lost its GPUs abnormally (node lost, GPU quarantined, drained): past the limit the job is
-- failed instead of requeued.
CREATE TABLE job_restarts (
    job_id       TEXT PRIMARY KEY,
    abnormal     INTEGER     NOT NULL,
    last_at      TIMESTAMPTZ NOT NULL
);
