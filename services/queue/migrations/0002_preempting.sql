-- Preemption is visible on the job: running → preempting (checkpoint now) → pending (requeued), counted.
ALTER TABLE jobs DROP CONSTRAINT jobs_state_check;
ALTER TABLE jobs ADD CONSTRAINT jobs_state_check
    CHECK (state IN ('pending','running','preempting','completed','cancelled','failed'));
ALTER TABLE jobs ADD COLUMN attempts INTEGER NOT NULL DEFAULT 0;
ALTER TABLE jobs ADD COLUMN preempt_deadline TIMESTAMPTZ;
