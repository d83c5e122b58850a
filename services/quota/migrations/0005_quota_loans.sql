-- Time-boxed quota loans: extra guarantee for one entry of the tree until a date, asked for by a team admin and
-- granted through the approval flow by a platform admin. What placement and admission see is the effective
-- guarantee (the entry's own plus its active loans): the view below.
ALTER TABLE approval_requests ALTER COLUMN job_id DROP NOT NULL;
ALTER TABLE approval_requests ADD COLUMN kind TEXT NOT NULL DEFAULT 'job' CHECK (kind IN ('job', 'loan'));
ALTER TABLE approval_requests ADD COLUMN loan_path TEXT;
ALTER TABLE approval_requests ADD COLUMN loan_gpu_model TEXT;
ALTER TABLE approval_requests ADD COLUMN loan_until TIMESTAMPTZ;
ALTER TABLE approval_requests ADD CONSTRAINT approval_requests_loan_complete
    CHECK (kind = 'job' OR (loan_path IS NOT NULL AND loan_gpu_model IS NOT NULL AND loan_until IS NOT NULL));

CREATE TABLE quota_loans (
    loan_id      TEXT PRIMARY KEY,            -- the approval that granted it
    path         TEXT             NOT NULL,
    gpu_model    TEXT             NOT NULL,
    gpus         DOUBLE PRECISION NOT NULL CHECK (gpus > 0),
    until        TIMESTAMPTZ      NOT NULL,
    reason       TEXT             NOT NULL,
    granted_by   TEXT             NOT NULL,
    granted_at   TIMESTAMPTZ      NOT NULL DEFAULT now(),
    expired_at   TIMESTAMPTZ                  -- set by the sweep that announced its end
);
CREATE INDEX quota_loans_active ON quota_loans (path, gpu_model) WHERE expired_at IS NULL;

CREATE VIEW quota_entries_effective AS
SELECT q.path, q.gpu_model, q.guaranteed + coalesce(l.gpus, 0) AS guaranteed, q.guaranteed AS base_guaranteed,
       coalesce(l.gpus, 0) AS loaned, q.borrowing_limit, q.lending_limit, q.weight, q.revision, q.updated_at
FROM quota_entries q
LEFT JOIN (SELECT path, gpu_model, sum(gpus) AS gpus FROM quota_loans
           WHERE expired_at IS NULL AND until > now() GROUP BY path, gpu_model) l USING (path, gpu_model);
