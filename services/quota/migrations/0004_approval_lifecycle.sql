-- A pending request is withdrawn when its job is cancelled before anyone decided; approval ids are uuid7, so
-- they order requests by time and serve as the list's cursor.
ALTER TABLE approval_requests DROP CONSTRAINT approval_requests_state_check;
ALTER TABLE approval_requests ADD CONSTRAINT approval_requests_state_check
    CHECK (state IN ('pending', 'approved', 'denied', 'withdrawn'));
CREATE INDEX approval_requests_id_desc ON approval_requests (approval_id DESC);
