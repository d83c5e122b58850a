-- A job requeued after an abnormal loss (its node lost, its GPU quarantined, its node drained) waits before it
-- is wanted again, longer after each loss, so a job that kills its GPUs does not hop from node to node at once.
ALTER TABLE jobs ADD COLUMN requeue_at TIMESTAMPTZ;
CREATE INDEX jobs_requeue_due ON jobs (requeue_at) WHERE requeue_at IS NOT NULL;
