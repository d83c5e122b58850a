-- How a job shares a GPU: a fraction (compute milli-GPU + memory) or one MIG slice; `exclusive` keeps a dev job
-- on a whole GPU. Whole-GPU jobs leave all of them at their defaults.
ALTER TABLE jobs ADD COLUMN gpu_fraction_milli INTEGER NOT NULL DEFAULT 0
    CHECK (gpu_fraction_milli BETWEEN 0 AND 999);
ALTER TABLE jobs ADD COLUMN gpu_memory_mib INTEGER NOT NULL DEFAULT 0 CHECK (gpu_memory_mib >= 0);
ALTER TABLE jobs ADD COLUMN mig_profile TEXT NOT NULL DEFAULT '';
ALTER TABLE jobs ADD COLUMN exclusive BOOLEAN NOT NULL DEFAULT false;
