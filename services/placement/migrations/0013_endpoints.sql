-- Where a service replica serves, as its agent announced it (endpoint.ready / endpoint.unready): the URL (the first
-- of its work's ports on its node's address), every named port, ready or not, since when, and why not. A later
-- announcement never gives way to an older one (`endpoint_at`).
ALTER TABLE allocations ADD COLUMN endpoint_url TEXT;
ALTER TABLE allocations ADD COLUMN endpoint_ports TEXT;
ALTER TABLE allocations ADD COLUMN endpoint_ready BOOLEAN;
ALTER TABLE allocations ADD COLUMN endpoint_at TIMESTAMPTZ;
ALTER TABLE allocations ADD COLUMN endpoint_reason TEXT;
