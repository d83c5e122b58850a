-- How a job holds GPUs: a gang over several nodes, or several independent replicas (inference).
ALTER TABLE jobs ADD COLUMN gang_nodes INTEGER NOT NULL DEFAULT 0;
ALTER TABLE jobs ADD COLUMN gpus_per_node INTEGER NOT NULL DEFAULT 0;
ALTER TABLE jobs ADD COLUMN replicas INTEGER NOT NULL DEFAULT 1 CHECK (replicas >= 1);
ALTER TABLE jobs ADD COLUMN max_runtime_s DOUBLE PRECISION;
