-- Sharing: a GPU is exclusive, fractional or in MIG mode (per GPU, set by its registration or an operator); a
-- job may want a fraction or a MIG slice; an allocation holds a share of each of its GPUs.
ALTER TABLE gpus ADD COLUMN sharing TEXT NOT NULL DEFAULT 'exclusive'
    CHECK (sharing IN ('exclusive', 'fractional', 'mig'));
-- true once an operator chose the mode: a later re-registration of the node does not undo that choice
ALTER TABLE gpus ADD COLUMN sharing_set_by_operator BOOLEAN NOT NULL DEFAULT false;

ALTER TABLE pending_jobs ADD COLUMN gpu_fraction_milli INTEGER NOT NULL DEFAULT 0;
ALTER TABLE pending_jobs ADD COLUMN gpu_memory_mib INTEGER NOT NULL DEFAULT 0;
ALTER TABLE pending_jobs ADD COLUMN mig_profile TEXT NOT NULL DEFAULT '';
ALTER TABLE pending_jobs ADD COLUMN exclusive BOOLEAN NOT NULL DEFAULT false;

-- What each allocation holds of each GPU: 1000 milli = the whole GPU; a fraction (with its memory); or one MIG
-- instance occupying memory slots [mig_start, mig_start + mig_slots).
ALTER TABLE allocation_gpus ADD COLUMN share_milli INTEGER NOT NULL DEFAULT 1000
    CHECK (share_milli BETWEEN 1 AND 1000);
ALTER TABLE allocation_gpus ADD COLUMN memory_mib INTEGER;
ALTER TABLE allocation_gpus ADD COLUMN mig_profile TEXT;
ALTER TABLE allocation_gpus ADD COLUMN mig_start INTEGER;
ALTER TABLE allocation_gpus ADD COLUMN mig_slots INTEGER;
ALTER TABLE allocation_gpus ADD CONSTRAINT allocation_gpus_mig_complete
    CHECK ((mig_profile IS NULL) = (mig_start IS NULL) AND (mig_profile IS NULL) = (mig_slots IS NULL));

-- The database, not the scheduler, has the last word on double allocation. A whole GPU has one live holder (the
-- unique index); shared holders are checked under a lock on the GPU's row: no whole holder beside them, fractions
-- within the GPU's compute and memory, MIG instances on disjoint slots.
DROP INDEX allocation_gpus_one_live_holder;
CREATE UNIQUE INDEX allocation_gpus_one_whole_holder ON allocation_gpus (gpu_uuid)
    WHERE live AND share_milli = 1000 AND mig_profile IS NULL;
CREATE INDEX allocation_gpus_live ON allocation_gpus (gpu_uuid) WHERE live;

CREATE FUNCTION allocation_gpus_fit() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    gpu_memory INTEGER;
    conflict   TEXT;
BEGIN
    SELECT memory_mib INTO gpu_memory FROM gpus WHERE uuid = NEW.gpu_uuid FOR UPDATE;
    IF NEW.mig_profile IS NOT NULL THEN
        SELECT allocation_id INTO conflict FROM allocation_gpus
        WHERE gpu_uuid = NEW.gpu_uuid AND live AND allocation_id <> NEW.allocation_id
          AND (mig_profile IS NULL
               OR int4range(mig_start, mig_start + mig_slots) && int4range(NEW.mig_start, NEW.mig_start + NEW.mig_slots))
        LIMIT 1;
    ELSIF NEW.share_milli < 1000 THEN
        SELECT allocation_id INTO conflict FROM allocation_gpus
        WHERE gpu_uuid = NEW.gpu_uuid AND live AND allocation_id <> NEW.allocation_id
          AND (mig_profile IS NOT NULL OR share_milli = 1000)
        LIMIT 1;
        IF conflict IS NULL AND (
            (SELECT coalesce(sum(share_milli), 0) FROM allocation_gpus
             WHERE gpu_uuid = NEW.gpu_uuid AND live AND allocation_id <> NEW.allocation_id) + NEW.share_milli > 1000
            OR (SELECT coalesce(sum(memory_mib), 0) FROM allocation_gpus
                WHERE gpu_uuid = NEW.gpu_uuid AND live AND allocation_id <> NEW.allocation_id)
               + coalesce(NEW.memory_mib, 0) > gpu_memory) THEN
            conflict := 'fractions over capacity';
        END IF;
    ELSE
        SELECT allocation_id INTO conflict FROM allocation_gpus
        WHERE gpu_uuid = NEW.gpu_uuid AND live AND allocation_id <> NEW.allocation_id LIMIT 1;
    END IF;
    IF conflict IS NOT NULL THEN
        RAISE EXCEPTION 'GPU % is already held (%)', NEW.gpu_uuid, conflict USING ERRCODE = 'unique_violation';
    END IF;
    RETURN NEW;
END $$;

CREATE TRIGGER allocation_gpus_fit BEFORE INSERT OR UPDATE OF live ON allocation_gpus
    FOR EACH ROW WHEN (NEW.live) EXECUTE FUNCTION allocation_gpus_fit();
