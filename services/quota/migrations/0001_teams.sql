CREATE TABLE orgs (
    org         TEXT PRIMARY KEY,
    created_at  TIMESTAMPTZ NOT NULL DEFAULT now()
);

CREATE TABLE teams (
    team        TEXT PRIMARY KEY,
    org         TEXT NOT NULL REFERENCES orgs (org),
    created_at  TIMESTAMPTZ NOT NULL DEFAULT now()
);

CREATE TABLE projects (
    team        TEXT NOT NULL REFERENCES teams (team),
    project     TEXT NOT NULL,
    created_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (team, project)
);

-- Per team and GPU model ('*' = any model). Limits are in whole GPUs.
CREATE TABLE quotas (
    team              TEXT    NOT NULL REFERENCES teams (team),
    gpu_model         TEXT    NOT NULL,
    guaranteed        INTEGER NOT NULL CHECK (guaranteed >= 0),
    borrowing_limit   INTEGER CHECK (borrowing_limit IS NULL OR borrowing_limit >= 0),
    lending_limit     INTEGER CHECK (lending_limit IS NULL OR lending_limit >= 0),
    over_quota_weight REAL    NOT NULL DEFAULT 1.0,
    PRIMARY KEY (team, gpu_model)
);

INSERT INTO orgs (org) VALUES ('default');
INSERT INTO teams (team, org) VALUES ('default', 'default');
