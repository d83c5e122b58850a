-- A sharing-mode change for a GPU that still holds work waits for it: the GPU keeps `sharing` and takes no new work
-- while `sharing_target` says what it becomes once its last allocation is released.
ALTER TABLE gpus ADD COLUMN sharing_target TEXT CHECK (sharing_target IN ('exclusive', 'fractional', 'mig'));
