-- Which transaction last changed a node or a GPU. A cycle keeps the pool in memory and re-reads only nodes that a
-- transaction its previous read could not see changed (the node's row or any of its GPUs'), as it does for the
-- wanted jobs (0007) and the live allocations (0021): at 1,024 nodes × 8 GPUs, reading and decoding the whole pool
-- every cycle was a fifth of a turnover cycle. Any change stamps the row (a cycle reads nearly all of both).
-- Rows written before this migration carry 0 and are read by the first cycle anyway.
ALTER TABLE nodes ADD COLUMN changed_xid xid8 NOT NULL DEFAULT '0';
ALTER TABLE gpus ADD COLUMN changed_xid xid8 NOT NULL DEFAULT '0';

CREATE FUNCTION pool_stamp_xid() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.changed_xid := pg_current_xact_id();
    RETURN NEW;
END $$;

CREATE TRIGGER nodes_stamp_xid BEFORE INSERT OR UPDATE ON nodes
    FOR EACH ROW EXECUTE FUNCTION pool_stamp_xid();
CREATE TRIGGER gpus_stamp_xid BEFORE INSERT OR UPDATE ON gpus
    FOR EACH ROW EXECUTE FUNCTION pool_stamp_xid();

-- a node's GPUs, for the read of the nodes that changed
CREATE INDEX gpus_by_node ON gpus (cluster, node);
