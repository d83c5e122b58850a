-- Where a node's peers reach it (RegisterNode.address): a gang's members rendezvous at their rank-0 node's address.
-- Nodes registered by older agents keep ''.
ALTER TABLE nodes ADD COLUMN address TEXT NOT NULL DEFAULT '';
