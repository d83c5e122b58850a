-- A replica set (a service) keeps its replicas' identity (job#n) even while it has one replica: its bounds say it
-- may scale (max_replicas > 1), so its single replica is placed, replaced and scaled as a replica, not as a job.
ALTER TABLE pending_jobs ADD COLUMN replica_set BOOLEAN NOT NULL DEFAULT false;
UPDATE pending_jobs SET replica_set = true WHERE replicas > 1;
