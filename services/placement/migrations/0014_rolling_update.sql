-- A rolling update of a service's work: while `rollout_target` is set the job wants one replica more than its
-- target (the surge), and its replicas running older work are stopped one at a time, each only once target + 1
-- replicas are ready, so no fewer than the target are ready meanwhile; then the surge replica goes.
ALTER TABLE pending_jobs ADD COLUMN rollout_target INT;
CREATE INDEX pending_jobs_rolling ON pending_jobs (job_id) WHERE rollout_target IS NOT NULL;
