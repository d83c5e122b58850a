-- Jobs made of several allocations: a gang (one allocation per node, all or nothing) or replicas (independent
-- copies, e.g. an inference service). A wanted job stays in pending_jobs until it finishes; `satisfied` says
-- whether every replica it wants currently holds GPUs.
ALTER TABLE pending_jobs ADD COLUMN gang_nodes INTEGER NOT NULL DEFAULT 0;
ALTER TABLE pending_jobs ADD COLUMN gpus_per_node INTEGER NOT NULL DEFAULT 0;
ALTER TABLE pending_jobs ADD COLUMN replicas INTEGER NOT NULL DEFAULT 1;
ALTER TABLE pending_jobs ADD COLUMN satisfied BOOLEAN NOT NULL DEFAULT false;
CREATE INDEX pending_jobs_unsatisfied ON pending_jobs (job_id) WHERE NOT satisfied;

ALTER TABLE allocations ADD COLUMN replica INTEGER NOT NULL DEFAULT 0;
DROP INDEX allocations_one_live_per_job;
-- Each replica (gang member) of a job holds at most one live allocation.
CREATE UNIQUE INDEX allocations_one_live_per_replica ON allocations (job_id, replica) WHERE released_at IS NULL;
-- Declared runtime limits: the core computes when capacity frees up, so smaller jobs can backfill safely.
ALTER TABLE pending_jobs ADD COLUMN max_runtime_s DOUBLE PRECISION;
ALTER TABLE allocations ADD COLUMN max_runtime_s DOUBLE PRECISION;
