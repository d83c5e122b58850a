-- What a job needs of its nodes besides GPUs: host CPU (milli-cores) and memory (MiB) reserved on each node it
-- holds, and the labels each of those nodes must carry; and its own word on preemption (NULL: its priority class
-- and kind decide). Existing jobs asked for none of it.
ALTER TABLE jobs ADD COLUMN cpu_milli INTEGER NOT NULL DEFAULT 0 CHECK (cpu_milli >= 0);
ALTER TABLE jobs ADD COLUMN memory_mib INTEGER NOT NULL DEFAULT 0 CHECK (memory_mib >= 0);
ALTER TABLE jobs ADD COLUMN node_selector JSONB NOT NULL DEFAULT '{}';
ALTER TABLE jobs ADD COLUMN preemptible BOOLEAN;
