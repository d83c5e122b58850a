-- What a node registers about its data-plane network and its volumes (NicSpec / VolumeSpec lists, as sent), and
-- the latest node-level throughput and storage use its telemetry reports. Nodes registered by older agents keep
-- empty lists and NULL numbers.
ALTER TABLE nodes ADD COLUMN network          JSONB            NOT NULL DEFAULT '[]';
ALTER TABLE nodes ADD COLUMN storage          JSONB            NOT NULL DEFAULT '[]';
ALTER TABLE nodes ADD COLUMN network_rx_mbps  DOUBLE PRECISION;
ALTER TABLE nodes ADD COLUMN network_tx_mbps  DOUBLE PRECISION;
ALTER TABLE nodes ADD COLUMN storage_used_gib DOUBLE PRECISION;
