-- gpupool — PostgreSQL initialisation for docker compose.
--
-- Runs once, on an empty data volume (the official image executes /docker-entrypoint-initdb.d/*.sql as
-- POSTGRES_USER). One database per service: no service ever reads another's tables. Each service also creates its
-- own database at start if it is missing, and applies its migrations (libs/store + services/<name>/migrations)
-- under an advisory lock — so this file only makes the layout explicit and lets a less privileged role be used
-- later. The agent has no database; the gateway's (API tokens, roles, audit log) is created ahead of the security
-- issue that fills it and is unused until then.

CREATE DATABASE gpupool_inventory;
CREATE DATABASE gpupool_quota;
CREATE DATABASE gpupool_queue;
CREATE DATABASE gpupool_placement;
CREATE DATABASE gpupool_reclamation;
CREATE DATABASE gpupool_accounting;
CREATE DATABASE gpupool_gateway;
