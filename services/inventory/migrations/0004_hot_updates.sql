-- The rows rewritten on every sample (a GPU's latest sample, its open minute, the node's heartbeat) leave room in
-- their pages, so PostgreSQL can update them in place (HOT) instead of adding index entries each second.
ALTER TABLE gpu_telemetry_latest SET (fillfactor = 50);
ALTER TABLE gpu_rollups SET (fillfactor = 70);
ALTER TABLE nodes SET (fillfactor = 50);
ALTER TABLE gpus SET (fillfactor = 80);
