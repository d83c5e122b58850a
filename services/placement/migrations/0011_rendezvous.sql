-- A job that runs as one (a single job or a gang) gets a rendezvous: its rank-0 member's address and a port
-- reserved there, so its members find each other the way torchrun expects (domain.rendezvous_environment).
-- `nodes.address`: where the node's peers reach it, as its agent registered it. An allocation keeps the host its
-- port was taken on (`rendezvous_host`: every loopback address counts as one host), the port, and its member's
-- environment, so the agent's resync (list_allocations) hands out exactly what the grant did.
ALTER TABLE nodes ADD COLUMN address TEXT NOT NULL DEFAULT '';
ALTER TABLE allocations ADD COLUMN rendezvous_host TEXT;
ALTER TABLE allocations ADD COLUMN rendezvous_port INT;
ALTER TABLE allocations ADD COLUMN rendezvous_env TEXT;
