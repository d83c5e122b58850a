-- Node lost / recovered (heartbeat timeout): when inventory declared the node lost, and a partial index so the
-- periodic sweep finds ready nodes that went silent without scanning the fleet.
ALTER TABLE nodes ADD COLUMN lost_at TIMESTAMPTZ;
CREATE INDEX nodes_ready_last_seen ON nodes (last_seen_at) WHERE state = 'ready';
