-- How many times a service's work was updated (rolled out): job.work_updated carries it.
ALTER TABLE jobs ADD COLUMN work_revision INT NOT NULL DEFAULT 0;
