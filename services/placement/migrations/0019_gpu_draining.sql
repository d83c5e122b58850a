-- A GPU being emptied for a new sharing mode (inventory's `draining_to`): it keeps its mode and takes no new work.
ALTER TABLE gpus ADD COLUMN draining BOOLEAN NOT NULL DEFAULT false;
