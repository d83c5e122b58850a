-- What telemetry learned about each live allocation, kept apart from its tracker: the telemetry consumer writes
-- only this table, the allocation consumer and the sweep only `trackers`, so their batch transactions never wait
-- on each other's row locks (a lock-order cycle between them was a deadlock). Readers join the two.
CREATE TABLE tracker_usage (
    allocation_id  TEXT PRIMARY KEY,
    last_sample_at TIMESTAMPTZ NOT NULL,
    last_busy_at   TIMESTAMPTZ,          -- the latest busy sample; the tracker's own last_busy_at is its grant
    mean_util_pct  REAL,
    max_util_pct   REAL
);
INSERT INTO tracker_usage (allocation_id, last_sample_at, last_busy_at, mean_util_pct, max_util_pct)
SELECT allocation_id, last_sample_at, last_busy_at, mean_util_pct, max_util_pct FROM trackers
WHERE last_sample_at IS NOT NULL;
ALTER TABLE trackers DROP COLUMN last_sample_at;
ALTER TABLE trackers DROP COLUMN mean_util_pct;
ALTER TABLE trackers DROP COLUMN max_util_pct;
