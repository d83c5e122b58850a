-- Retention (libs/store/retention.py): the indexes its batched deletes walk, and the horizon it has pruned up to.

-- Only published rows are ever pruned, oldest first; unpublished rows stay out of this index.
CREATE INDEX IF NOT EXISTS outbox_published_at ON outbox (published_at) WHERE published_at IS NOT NULL;
CREATE INDEX IF NOT EXISTS inbox_processed_at ON inbox (processed_at);

-- One row per pruned table ('outbox', 'inbox'): rows older than `pruned_before` may be gone. Written (and
-- committed) before the deletes it allows, so any reader that misses a row also sees why: `gpupool check` uses it
-- to tell a pruned event from a lost one. Never moves back.
CREATE TABLE IF NOT EXISTS store_retention (
    what          TEXT        PRIMARY KEY,
    pruned_before TIMESTAMPTZ NOT NULL
);
