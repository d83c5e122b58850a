-- A job may carry the work the node's agent runs (its command and how to run it). Such a job is `launching`
-- between its grant and the agent's report that the process started; how its last attempt ended is kept.
ALTER TABLE jobs DROP CONSTRAINT jobs_state_check;
ALTER TABLE jobs ADD CONSTRAINT jobs_state_check
    CHECK (state IN ('awaiting_approval','pending','launching','running','preempting','completed','cancelled',
                     'failed'));
ALTER TABLE jobs ADD COLUMN work JSONB;
ALTER TABLE jobs ADD COLUMN exit_code INT;
ALTER TABLE jobs ADD COLUMN reason TEXT;
-- restarts after failures (the restart policy counts these; `attempts` counts every requeue)
ALTER TABLE jobs ADD COLUMN restarts INT NOT NULL DEFAULT 0;
-- the first failure of the current attempt, kept while other gang members are still being stopped
ALTER TABLE jobs ADD COLUMN attempt_failure JSONB;
