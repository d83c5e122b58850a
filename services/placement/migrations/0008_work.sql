-- A job's work (what the node's agent runs) and its attempt travel with the wanted job into each allocation. An
-- allocation with work is released only once its agent reports the work's cgroup empty (`agent.work_exited`):
-- every release placement decides for it (cancel, complete, reclaim, scale-down, preemption deadline) first asks
-- the agent to stop the work, as a preemption does, and the exit releases the GPUs. `exit` is how the work ended.
ALTER TABLE pending_jobs ADD COLUMN work TEXT;
ALTER TABLE pending_jobs ADD COLUMN attempt INT NOT NULL DEFAULT 0;
ALTER TABLE allocations ADD COLUMN work TEXT;
ALTER TABLE allocations ADD COLUMN attempt INT NOT NULL DEFAULT 0;
ALTER TABLE allocations ADD COLUMN exit TEXT;
CREATE INDEX allocations_stopping ON allocations (preempt_deadline)
    WHERE released_at IS NULL AND preempt_deadline IS NOT NULL;
