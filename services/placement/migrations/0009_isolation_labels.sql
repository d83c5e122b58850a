-- Which isolation drivers a node's agent can run, and which one a wanted job's work needs. The agent reports the
-- drivers as node labels (`gpupool.io/isolation.<driver>=true`, from `node.registered`); a job whose work has a
-- command needs a node with its driver's label (domain.isolation_selector). `isolation` is derived from the work
-- when the job is wanted (NULL: no work, any node), so a cycle never parses the work's JSON.
ALTER TABLE nodes ADD COLUMN labels JSONB NOT NULL DEFAULT '{}';
ALTER TABLE pending_jobs ADD COLUMN isolation TEXT;

-- The cycle reads `isolation` now: a change to it must stamp changed_xid (0007), and so must one to `work`.
DROP TRIGGER pending_jobs_stamp_xid ON pending_jobs;
CREATE TRIGGER pending_jobs_stamp_xid
    BEFORE INSERT OR UPDATE OF job_id, team, project, gpus, gpu_models, priority, submitted_at, traceparent,
                               priority_class, kind, gang_nodes, gpus_per_node, replicas, max_runtime_s,
                               gpu_fraction_milli, gpu_memory_mib, mig_profile, exclusive, satisfied, work, isolation
    ON pending_jobs FOR EACH ROW EXECUTE FUNCTION pending_jobs_stamp_xid();

UPDATE pending_jobs SET isolation = coalesce(work::jsonb ->> 'isolation', 'process') WHERE work IS NOT NULL;
