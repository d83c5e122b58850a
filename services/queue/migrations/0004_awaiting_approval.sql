-- A submission that an admission rule sends to a person waits in awaiting_approval until decided.
ALTER TABLE jobs DROP CONSTRAINT jobs_state_check;
ALTER TABLE jobs ADD CONSTRAINT jobs_state_check
    CHECK (state IN ('awaiting_approval','pending','running','preempting','completed','cancelled','failed'));
ALTER TABLE jobs ADD COLUMN approval_id TEXT;
