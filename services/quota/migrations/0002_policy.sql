-- Quotas on every level of the org → team → project tree (path 'org', 'org/team' or 'org/team/project'),
-- priority classes owned here, and one revision sequence so read models keep the newest state of each row.
CREATE SEQUENCE policy_revision;

CREATE TABLE quota_entries (
    path            TEXT    NOT NULL,
    gpu_model       TEXT    NOT NULL,
    guaranteed      DOUBLE PRECISION NOT NULL CHECK (guaranteed >= 0),
    borrowing_limit DOUBLE PRECISION CHECK (borrowing_limit IS NULL OR borrowing_limit >= 0),
    lending_limit   DOUBLE PRECISION CHECK (lending_limit IS NULL OR lending_limit >= 0),
    weight          DOUBLE PRECISION NOT NULL DEFAULT 1.0 CHECK (weight > 0),
    revision        BIGINT  NOT NULL DEFAULT nextval('policy_revision'),
    updated_at      TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (path, gpu_model)
);

INSERT INTO quota_entries (path, gpu_model, guaranteed, borrowing_limit, lending_limit, weight)
SELECT t.org || '/' || q.team, q.gpu_model, q.guaranteed, q.borrowing_limit, q.lending_limit, q.over_quota_weight
FROM quotas q JOIN teams t USING (team);
DROP TABLE quotas;

CREATE TABLE priority_classes (
    name           TEXT PRIMARY KEY,
    value          INTEGER NOT NULL,
    preemptible    BOOLEAN NOT NULL,
    min_runtime_s  DOUBLE PRECISION,
    description    TEXT NOT NULL DEFAULT '',
    revision       BIGINT NOT NULL DEFAULT nextval('policy_revision'),
    updated_at     TIMESTAMPTZ NOT NULL DEFAULT now()
);
INSERT INTO priority_classes (name, value, preemptible, min_runtime_s, description) VALUES
    ('production-inference', 1000, false, NULL, 'serving traffic: never preempted by other classes'),
    ('high',                  100, false, NULL, 'core training'),
    ('normal',                  0, true,  NULL, 'default'),
    ('low',                   -50, true,  NULL, 'runs when there is room'),
    ('best-effort',          -100, true,  60,   'backfill; preempted first');

ALTER TABLE teams ADD COLUMN revision BIGINT NOT NULL DEFAULT nextval('policy_revision');
