-- Each node's agent lists its own node's live allocations when it starts and every `resync_s` after (a grant or a
-- stop missed on core NATS). A fleet of 1,024 nodes is 34 such reads a second; without an index each one filtered
-- every live allocation of the cluster.
CREATE INDEX allocations_live_by_node ON allocations (cluster, node, allocation_id) WHERE released_at IS NULL;
