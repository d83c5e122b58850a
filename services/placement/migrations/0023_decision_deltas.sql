-- A recorded cycle's input and plan kept as what changed against an earlier recorded cycle, a keyframe
-- (services/placement/recording.py): at 1,024 nodes with 10,000 jobs waiting, writing both whole each cycle
-- (megabytes of JSON, gzipped, inserted) was most of a turnover cycle's store phase, and `decision_retention`
-- copies of them most of this database. New rows fill `record_gz` (gzip of the record's text) and, for a delta,
-- `base_id`; rows recorded before keep `input_gz` and `plan_json` and are read as before.
ALTER TABLE decisions ALTER COLUMN input_gz DROP NOT NULL,
                      ALTER COLUMN plan_json DROP NOT NULL,
                      ADD COLUMN base_id TEXT REFERENCES decisions (cycle_id),
                      ADD COLUMN record_gz BYTEA,
                      ADD CONSTRAINT decisions_recorded CHECK (
                          record_gz IS NOT NULL OR (input_gz IS NOT NULL AND plan_json IS NOT NULL)),
                      ADD CONSTRAINT decisions_delta_has_record CHECK (base_id IS NULL OR record_gz IS NOT NULL);

-- the prune keeps every keyframe a kept delta needs
CREATE INDEX decisions_base ON decisions (base_id) WHERE base_id IS NOT NULL;
