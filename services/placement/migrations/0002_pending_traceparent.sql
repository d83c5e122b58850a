-- The trace of the submission, so the placement (and its allocation.granted event) joins the same trace.
ALTER TABLE pending_jobs ADD COLUMN traceparent TEXT;
