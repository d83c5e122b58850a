-- The open minute's rollup sums live on the GPU's latest row (one in-place update per sample instead of a second
-- upsert into gpu_rollups); a minute moves to gpu_rollups once it is over: when the GPU's first sample of a later
-- minute arrives, or when the rollup pass closes it. Rows written before this migration stay in gpu_rollups and a
-- finished minute merges into them.
ALTER TABLE gpu_telemetry_latest ADD COLUMN win_start     TIMESTAMPTZ;
ALTER TABLE gpu_telemetry_latest ADD COLUMN win_samples   INTEGER          NOT NULL DEFAULT 0;
ALTER TABLE gpu_telemetry_latest ADD COLUMN win_util_sum  DOUBLE PRECISION NOT NULL DEFAULT 0;
ALTER TABLE gpu_telemetry_latest ADD COLUMN win_util_max  REAL             NOT NULL DEFAULT 0;
ALTER TABLE gpu_telemetry_latest ADD COLUMN win_mem_sum   DOUBLE PRECISION NOT NULL DEFAULT 0;
ALTER TABLE gpu_telemetry_latest ADD COLUMN win_mem_max   INTEGER          NOT NULL DEFAULT 0;
ALTER TABLE gpu_telemetry_latest ADD COLUMN win_power_sum DOUBLE PRECISION NOT NULL DEFAULT 0;
ALTER TABLE gpu_telemetry_latest ADD COLUMN win_power_n   INTEGER          NOT NULL DEFAULT 0;
ALTER TABLE gpu_telemetry_latest ADD COLUMN win_temp_max  REAL;
ALTER TABLE gpu_telemetry_latest ADD COLUMN win_procs_max INTEGER          NOT NULL DEFAULT 0;
