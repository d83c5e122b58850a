-- What a node's registration says of each GPU's place on the node (the core keeps a multi-GPU job on one NVLink
-- domain, then one NUMA node): its NUMA node (NULL: unknown) and its NVLink domain, the GPUs it reaches over
-- NVLink and those they reach, named after the lowest index among them ('' when it has no NVLink peer).
ALTER TABLE gpus ADD COLUMN numa_node INTEGER;
ALTER TABLE gpus ADD COLUMN nvlink_domain TEXT NOT NULL DEFAULT '';
