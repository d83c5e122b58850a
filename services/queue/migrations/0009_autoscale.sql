-- A service's replica bounds and autoscaling policy (AutoscalePolicy as JSON), when it last scaled, the
-- recommendations its stabilisation windows still need ((at, replicas) pairs as JSON), and the latest load each
-- reporter gave (`POST /v1/jobs/{id}/load`; their sum is the service's load).
ALTER TABLE jobs ADD COLUMN min_replicas INT;
ALTER TABLE jobs ADD COLUMN max_replicas INT;
ALTER TABLE jobs ADD COLUMN autoscale TEXT;
ALTER TABLE jobs ADD COLUMN scaled_at TIMESTAMPTZ;
ALTER TABLE jobs ADD COLUMN autoscale_recs TEXT NOT NULL DEFAULT '[]';
CREATE INDEX jobs_autoscaled ON jobs (job_id) WHERE autoscale IS NOT NULL
    AND state IN ('pending', 'launching', 'running', 'preempting');
CREATE TABLE autoscale_load (
    job_id TEXT NOT NULL,
    reporter TEXT NOT NULL,
    value DOUBLE PRECISION NOT NULL,
    at TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (job_id, reporter)
);
