-- A replicated job whose replicas keep failing (a command not found, a crash at start) was placed again at once,
-- hundreds of times a minute. Each failed replica now pushes the job's next placement back (domain.replica_back_off:
-- 1 s, doubling, at most 5 min; a replica that ran for a minute starts the count again), as Kubernetes' crash-loop
-- back-off does. `not_before`: no replica of the job is placed before it; `replica_failures`: failures in a row.
ALTER TABLE pending_jobs ADD COLUMN not_before TIMESTAMPTZ;
ALTER TABLE pending_jobs ADD COLUMN replica_failures INT NOT NULL DEFAULT 0;
