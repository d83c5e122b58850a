-- Host CPU and memory: what each node has (from its registration: cpu_count × 1000 milli-cores, memory_mib), what
-- a wanted job asks for on each node it holds, and what each live allocation keeps of its node, so the core counts
-- what runs against what the node has. A wanted job's `node_selector` (labels its nodes must carry, merged with
-- the selector its work's isolation implies) and its own `preemptible` (NULL: its class and kind decide), which
-- its allocations keep so the core honours it when it chooses victims. 0: not tracked / none asked for.
ALTER TABLE nodes ADD COLUMN cpu_milli INTEGER NOT NULL DEFAULT 0;
ALTER TABLE nodes ADD COLUMN memory_mib INTEGER NOT NULL DEFAULT 0;
ALTER TABLE pending_jobs ADD COLUMN cpu_milli INTEGER NOT NULL DEFAULT 0;
ALTER TABLE pending_jobs ADD COLUMN memory_mib INTEGER NOT NULL DEFAULT 0;
ALTER TABLE pending_jobs ADD COLUMN node_selector JSONB NOT NULL DEFAULT '{}';
ALTER TABLE pending_jobs ADD COLUMN preemptible BOOLEAN;
ALTER TABLE allocations ADD COLUMN cpu_milli INTEGER NOT NULL DEFAULT 0;
ALTER TABLE allocations ADD COLUMN memory_mib INTEGER NOT NULL DEFAULT 0;
ALTER TABLE allocations ADD COLUMN preemptible BOOLEAN;

-- The cycle reads the new columns: a change to them must stamp changed_xid (0007, 0009).
DROP TRIGGER pending_jobs_stamp_xid ON pending_jobs;
CREATE TRIGGER pending_jobs_stamp_xid
    BEFORE INSERT OR UPDATE OF job_id, team, project, gpus, gpu_models, priority, submitted_at, traceparent,
                               priority_class, kind, gang_nodes, gpus_per_node, replicas, max_runtime_s,
                               gpu_fraction_milli, gpu_memory_mib, mig_profile, exclusive, satisfied, work, isolation,
                               cpu_milli, memory_mib, node_selector, preemptible
    ON pending_jobs FOR EACH ROW EXECUTE FUNCTION pending_jobs_stamp_xid();
