-- A gang's members start together: each member's allocation waits (`gang_wait`) until its agent reports the grant
-- applied (`ready_at`, from agent.work_ready); once every live member is ready placement announces
-- allocation.gang_ready and the waits end. A gang not ready within GANG_START_TIMEOUT_S of its grant is released
-- whole (GangStartTimeout) and the queue requeues it.
ALTER TABLE allocations ADD COLUMN gang_wait BOOLEAN NOT NULL DEFAULT false;
ALTER TABLE allocations ADD COLUMN ready_at TIMESTAMPTZ;
CREATE INDEX allocations_gang_waiting ON allocations (granted_at) WHERE released_at IS NULL AND gang_wait;
