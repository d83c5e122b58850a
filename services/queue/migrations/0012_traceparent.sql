-- The trace a job's life is recorded in: the traceparent of its submission (the gateway's request), kept so each
-- later step (an attempt's start and end, a preemption, the completion) is a span of that same trace. Jobs from
-- before had none.
ALTER TABLE jobs ADD COLUMN traceparent TEXT;
