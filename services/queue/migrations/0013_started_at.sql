-- Admission back-pressure derives Retry-After from how many jobs were granted lately across every queue replica
-- (each replica sees only the grants it consumes): counted from the jobs' last start, which this index keeps cheap.
CREATE INDEX jobs_started_at ON jobs (started_at) WHERE started_at IS NOT NULL;
