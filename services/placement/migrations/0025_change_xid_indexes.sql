-- A cycle's read asks each table for the rows changed at or above its horizon (0007, 0021, 0022, 0024). Without an
-- index each of those was a scan of the whole table — at 10,000 waiting jobs, 6,000 live allocations and 8,192
-- GPUs, about 10 ms of a turnover cycle whose read returns a handful of rows.
CREATE INDEX pending_jobs_changed_xid ON pending_jobs (changed_xid);
CREATE INDEX allocations_live_xid ON allocations (changed_xid) WHERE released_at IS NULL;
CREATE INDEX gpus_changed_xid ON gpus (changed_xid);
CREATE INDEX nodes_changed_xid ON nodes (changed_xid);
