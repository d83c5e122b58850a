-- An Idempotency-Key belongs to the caller that chose it: two callers' keys never collide, and one caller
-- cannot learn that another used a key. Keys stored before this belong to no caller ('').
ALTER TABLE jobs ADD COLUMN idempotency_scope TEXT NOT NULL DEFAULT '';
ALTER TABLE jobs DROP CONSTRAINT jobs_idempotency_key_key;
CREATE UNIQUE INDEX jobs_idempotency ON jobs (idempotency_scope, idempotency_key) WHERE idempotency_key IS NOT NULL;
