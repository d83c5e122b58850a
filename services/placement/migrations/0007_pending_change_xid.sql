-- Which transaction last changed what a scheduling cycle reads of a wanted job. A cycle keeps the wanted jobs in
-- memory and re-reads only rows changed by transactions its previous read could not see (changed_xid at or above
-- that read's snapshot xmin): with thousands of jobs waiting, reading and decoding all of them every cycle was
-- most of what a cycle cost. Rows written before this migration carry 0 and are read by the first cycle anyway.
ALTER TABLE pending_jobs ADD COLUMN changed_xid xid8 NOT NULL DEFAULT '0';

CREATE FUNCTION pending_jobs_stamp_xid() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.changed_xid := pg_current_xact_id();
    RETURN NEW;
END $$;

-- Not on `reason` / `message`: cycles write those and never read them back.
CREATE TRIGGER pending_jobs_stamp_xid
    BEFORE INSERT OR UPDATE OF job_id, team, project, gpus, gpu_models, priority, submitted_at, traceparent,
                               priority_class, kind, gang_nodes, gpus_per_node, replicas, max_runtime_s,
                               gpu_fraction_milli, gpu_memory_mib, mig_profile, exclusive, satisfied
    ON pending_jobs FOR EACH ROW EXECUTE FUNCTION pending_jobs_stamp_xid();
