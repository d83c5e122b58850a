-- A cycle reads only what changed since its last read (0007, 0021, 0022); it used to read every wanted job's,
-- live allocation's and node's id and version each cycle as well, to see removals: at 10,000 waiting jobs,
-- 6,000 running and 1,024 nodes that list was most of the read. Now the read returns the changed rows, how many
-- there are, and what left: wanted jobs leave by turning satisfied (an update, stamped) or by being deleted
-- (remembered here by the transaction that deleted them), allocations by their release (an update, stamped).
CREATE TABLE pending_gone (
    job_id      TEXT        NOT NULL,
    changed_xid xid8        NOT NULL DEFAULT pg_current_xact_id(),
    gone_at     TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE INDEX pending_gone_xid ON pending_gone (changed_xid);
CREATE INDEX pending_gone_at ON pending_gone (gone_at);

CREATE FUNCTION pending_jobs_remember_gone() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO pending_gone (job_id) VALUES (OLD.job_id);
    RETURN OLD;
END $$;

CREATE TRIGGER pending_jobs_remember_gone AFTER DELETE ON pending_jobs
    FOR EACH ROW EXECUTE FUNCTION pending_jobs_remember_gone();

-- the allocations released since a read (a cycle's copy drops them), without reading the history
CREATE INDEX allocations_released_xid ON allocations (changed_xid) WHERE released_at IS NOT NULL;
