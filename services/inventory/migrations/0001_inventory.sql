CREATE TABLE clusters (
    cluster     TEXT PRIMARY KEY,
    created_at  TIMESTAMPTZ NOT NULL DEFAULT now()
);

CREATE TABLE nodes (
    cluster         TEXT        NOT NULL REFERENCES clusters (cluster),
    node            TEXT        NOT NULL,
    hostname        TEXT        NOT NULL,
    cpu_count       INTEGER     NOT NULL,
    memory_mib      BIGINT      NOT NULL,
    driver_version  TEXT        NOT NULL DEFAULT '',
    agent_version   TEXT        NOT NULL DEFAULT '',
    labels          JSONB       NOT NULL DEFAULT '{}',
    state           TEXT        NOT NULL DEFAULT 'ready',
    registered_at   TIMESTAMPTZ NOT NULL,
    last_seen_at    TIMESTAMPTZ NOT NULL,
    cpu_util_pct    REAL,
    memory_used_mib BIGINT,
    PRIMARY KEY (cluster, node)
);

CREATE TABLE gpus (
    uuid            TEXT PRIMARY KEY,
    cluster         TEXT    NOT NULL,
    node            TEXT    NOT NULL,
    idx             INTEGER NOT NULL,
    model           TEXT    NOT NULL,
    name            TEXT    NOT NULL DEFAULT '',
    memory_mib      INTEGER NOT NULL,
    numa_node       INTEGER,
    nvlink_peers    INTEGER[] NOT NULL DEFAULT '{}',
    mig_mode        BOOLEAN NOT NULL DEFAULT false,
    health          TEXT    NOT NULL DEFAULT 'healthy',
    health_reasons  TEXT[]  NOT NULL DEFAULT '{}',
    FOREIGN KEY (cluster, node) REFERENCES nodes (cluster, node)
);
CREATE INDEX gpus_node ON gpus (cluster, node, idx);

-- Latest sample per GPU (history lives in the telemetry stream and, later, rollups).
CREATE TABLE gpu_telemetry_latest (
    uuid                    TEXT PRIMARY KEY REFERENCES gpus (uuid),
    sampled_at              TIMESTAMPTZ NOT NULL,
    utilization_gpu_pct     REAL    NOT NULL,
    utilization_memory_pct  REAL    NOT NULL,
    memory_used_mib         INTEGER NOT NULL,
    temperature_c           REAL,
    power_w                 REAL,
    sm_clock_mhz            INTEGER,
    ecc_volatile_sbe        BIGINT  NOT NULL DEFAULT 0,
    ecc_volatile_dbe        BIGINT  NOT NULL DEFAULT 0,
    xid_last                INTEGER,
    throttle_reasons        TEXT[]  NOT NULL DEFAULT '{}',
    process_count           INTEGER NOT NULL DEFAULT 0
);
