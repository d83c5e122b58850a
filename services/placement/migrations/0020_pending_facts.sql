-- The facts of a wanted job's pending reason (the core's ReasonFacts as libs.contracts.reasons.PendingFacts JSON):
-- written with `reason` and `message` by each cycle, read back only by explain. No trigger stamps it (0007): a
-- cycle never reads it.
ALTER TABLE pending_jobs ADD COLUMN facts JSONB;
